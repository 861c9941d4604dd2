"""SP005: follow execute_model() with sample_tokens() (two-phase execution).

vLLM >= 0.12 splits a step in two: the model runner's execute_model() stores its state
and returns None, and sample_tokens(grammar_output) must follow, or the next
execute_model() raises "State error: sample_tokens() must be called after execute_model()
returns None". GPUWorker.sample_tokens (vllm/v1/worker/gpu_worker.py) delegates to the
runner and executors expose sample_tokens(grammar_output, non_block=False)
(vllm/v1/executor/abstract.py). None is valid without structured output. The emitted
form calls it only when execute_model returned None and the executor has it, so it is
also right on single-phase releases.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import calls_to, replace_statements, same_code
from patcher.fixes.patch import CheckHooks, Patch, PatchCodemod, VllmFact
from patcher.fixes.probes import method_defined
from speculators_patch_codemods import two_phase_step

ANY_EXECUTE = m.Call(
    func=m.Attribute(value=m.Attribute(m.Name("self"), m.Name("executor")), attr=m.Name("execute_model"))
)
EXECUTE = m.SimpleStatementLine(body=[m.Expr(ANY_EXECUTE)])
STEP = "self.executor.execute_model(scheduler_output)"  # the one call rewritten: its result is what it tests
# What each such statement becomes (two_phase_step, which SP025 reads too).
TWO_PHASE = two_phase_step.TWO_PHASE


class CallSampleTokens(PatchCodemod):
    DESCRIPTION = "self.executor.execute_model(out) -> also self.executor.sample_tokens(None)"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if calls_to(tree, "sample_tokens"):
            self.already_satisfied("sample_tokens() already follows execute_model()")
        steps = m.findall(tree, EXECUTE)
        if not steps:
            self.refuse(None, f"a statement {STEP}")
        # Every call is rewritten into TWO_PHASE, which passes scheduler_output: another argument,
        # or a call whose result is already used, is not a shape it may replace.
        alone = {id(call) for step in steps for call in m.findall(step, ANY_EXECUTE)}
        for call in m.findall(tree, ANY_EXECUTE):
            if id(call) not in alone or not same_code(call, STEP):
                self.refuse(call, f"every self.executor.execute_model call a statement {STEP}")
        return replace_statements(tree, {EXECUTE: TWO_PHASE})


PATCH = Patch(
    id="SP005",
    name="two-phase-execution",
    version=1,
    title="Two-phase execution: call sample_tokens(None) after execute_model() returns None",
    risk="the second step fails: sample_tokens() must follow execute_model()",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=CallSampleTokens,
    facts=(
        VllmFact(
            summary="the worker runs a step in two phases, execute_model then sample_tokens",
            symbol="Worker.sample_tokens",
            first_release="0.12.0",
            probe=method_defined("vllm/v1/worker/gpu_worker.py", "Worker.sample_tokens", "grammar_output"),
        ),
        VllmFact(
            summary="executors expose sample_tokens(grammar_output, non_block=False)",
            symbol="Executor.sample_tokens",
            first_release="0.12.0",
            probe=method_defined("vllm/v1/executor/abstract.py", "Executor.sample_tokens", "grammar_output"),
        ),
    ),
    order=50,
    portable=True,
    checks=CheckHooks(engine_steps=("sample_tokens",), symptoms=(r"sample_tokens\(\) must be called",)),
)

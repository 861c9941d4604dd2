"""SP027: recognise Model Runner V2 by its batch state, and advise only what this vLLM has (worker).

SP022 reads each step's layout from V1's ``input_batch`` or from V2's ``execute_model_state``,
and before the first step it recognises V2 by its module path (``vllm.v1.worker.gpu.``). vLLM
0.34 breaks both assumptions its messages and that test made:
- the CPU worker builds a Model Runner V2 of its own (``CPUModelRunner`` from
  vllm/v1/worker/cpu/model_runner.py, imported at the top of vllm/v1/worker/cpu_worker.py; a
  ``StandaloneCPUModelRunner`` on CPUs without Triton): capture setup refused the CPU engine;
- the V1 GPU runner (vllm/v1/worker/gpu_model_runner.py) and ``VLLM_USE_V2_MODEL_RUNNER`` are
  gone (vllm/platforms/interface.py refuses any value but 1), yet both refusals told users to
  set the variable to 0.

The emitted code recognises V2 by what capture reads: a runner that keeps ``execute_model_state``
(set in ``__init__`` from 0.17, by ``execute_model`` before). Its refusals name
``VLLM_USE_V2_MODEL_RUNNER=0`` only where vLLM still has the V1 runner to select.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import statements
from patcher.fixes.patch import Patch, PatchCodemod, VllmFact
from patcher.fixes.probes import imports_at_top
from speculators_patch_codemods import capture_methods

CLASS = m.ClassDef(name=m.Name("HiddenStatesWorkerExtension"))
HELPER = m.FunctionDef(name=m.Name("_keeps_batch_state"))
REPLACED = ("_track_batch_layout", "_step_layout")

FUNCTIONS = '''\
def _keeps_batch_state(runner):
    """Whether ``runner`` keeps each step's batch in ``execute_model_state``, as Model Runner V2
    does (vllm/v1/worker/gpu/model_runner.py; the CPU runners built on it from vLLM 0.34)."""
    import inspect

    if hasattr(runner, "execute_model_state"):
        return True
    code = getattr(inspect.unwrap(getattr(type(runner), "execute_model", None)), "__code__", None)
    return code is not None and "execute_model_state" in code.co_names


def _model_runner_advice():
    """What a user can do about a runner capture cannot read, on the installed vLLM."""
    import importlib.util

    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None:
        return "set VLLM_USE_V2_MODEL_RUNNER=0 to select vLLM's V1 model runner"
    return "this vLLM has no other model runner (V1 was removed in 0.34): report it to speculators-patch"
'''

METHODS = '''\
class HiddenStatesWorkerExtension:

    def _track_batch_layout(self):
        """Record each executed step's requests and token counts in the order of its tokens.

        A step's tokens are laid out in the model runner's batch order, not in submission
        order, and a prompt may be split across steps (chunked prefill). V1's persistent
        batch and Model Runner V2's per-step batch are read (``_step_layout``).
        """
        runner = self.model_runner  # type: ignore[attr-defined]
        if not hasattr(runner, "input_batch") and not _keeps_batch_state(runner):
            raise RuntimeError(
                "speculators-patch: hidden-state capture cannot read the batch layout of "
                f"{type(runner).__module__}.{type(runner).__name__} (neither V1's input_batch "
                f"nor Model Runner V2's execute_model_state): {_model_runner_advice()}"
            )
        execute_model = runner.execute_model
        if getattr(execute_model, "_records_batch_layout", False):
            return

        def execute_model_recording_layout(scheduler_output, *args, **kwargs):
            output = execute_model(scheduler_output, *args, **kwargs)
            # V2's _dummy_run (memory profiling, warm-up) calls it with made-up requests.
            if scheduler_output.num_scheduled_tokens and not kwargs.get("dummy_run"):
                self._batch_layouts.append(self._step_layout(scheduler_output))
            return output

        execute_model_recording_layout._records_batch_layout = True
        runner.execute_model = execute_model_recording_layout

    def _step_layout(self, scheduler_output):
        """[(request id, scheduled tokens)] of the step just executed, in token order.

        V1 (vllm/v1/worker/gpu_model_runner.py, up to 0.33) keeps one persistent batch:
        tokens follow input_batch.req_id_to_index. Model Runner V2 (vllm/v1/worker/gpu/
        model_runner.py and the CPU runners built on it) builds an InputBatch per step
        (req_ids, num_scheduled_tokens) and keeps it in execute_model_state until
        sample_tokens: a tuple holding it before vLLM 0.18.
        """
        runner = self.model_runner  # type: ignore[attr-defined]
        scheduled = scheduler_output.num_scheduled_tokens
        if hasattr(runner, "input_batch"):
            index = runner.input_batch.req_id_to_index
            missing = [req_id for req_id in scheduled if req_id not in index]
            if missing:
                raise RuntimeError(f"Scheduled requests not in the batch: {missing}")
            return sorted(scheduled.items(), key=lambda item: index[item[0]])
        state = getattr(runner, "execute_model_state", None)
        batch = getattr(state, "input_batch", None)
        if batch is None and isinstance(state, tuple):
            batch = next((item for item in state if hasattr(item, "req_ids")
                          and hasattr(item, "num_scheduled_tokens")), None)
        if batch is None:
            raise RuntimeError(
                f"speculators-patch: {type(runner).__name__} kept no input batch for this step "
                f"(execute_model_state): {_model_runner_advice()}"
            )
        layout = [(req_id, int(n)) for req_id, n in zip(batch.req_ids, batch.num_scheduled_tokens)]
        if dict(layout) != dict(scheduled):
            raise RuntimeError(
                f"Model Runner V2's batch {dict(layout)} differs from the scheduled tokens {dict(scheduled)}"
            )
        return layout
'''


def _methods(code: str, newline: str) -> dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in capture_methods.class_body(code, newline) if isinstance(s, cst.FunctionDef)}


class RecogniseV2ByBatchState(PatchCodemod):
    DESCRIPTION = "SP022's V2 test by module path -> by execute_model_state; advice per installed vLLM"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if any(m.matches(s, HELPER) for s in tree.body):
            self.already_satisfied("Model Runner V2 is recognised by its batch state")
        # The one shape accepted: SP022's two methods as SP022 writes them (hand edits are refused).
        expected = _methods(capture_methods.EITHER_RUNNER, tree.default_newline)
        classes = [s for s in tree.body if m.matches(s, CLASS)]
        found = {
            f.name.value: f
            for c in classes
            for f in c.body.body
            if isinstance(f, cst.FunctionDef) and f.name.value in REPLACED
        }
        for name in REPLACED:
            if name not in found or not found[name].deep_equals(
                expected[name].with_changes(leading_lines=found[name].leading_lines)
            ):
                self.refuse(
                    found.get(name),
                    f"class HiddenStatesWorkerExtension with SP022's {name}, unedited (SP027 applies after SP022)",
                )
        return tree.visit(
            _Rewrite(_methods(METHODS, tree.default_newline), FUNCTIONS.replace("\n", tree.default_newline))
        )


class _Rewrite(cst.CSTTransformer):
    def __init__(self, methods: dict[str, cst.FunctionDef], functions: str) -> None:
        super().__init__()
        self.methods, self.functions = methods, functions

    def leave_FunctionDef(self, original, updated):
        if updated.name.value in self.methods:
            return self.methods[updated.name.value].with_changes(leading_lines=updated.leading_lines)
        return updated

    def leave_ClassDef(self, original, updated):
        if not m.matches(updated, CLASS):
            return updated
        # The helpers go right above the class, which keeps its two blank lines.
        helpers = statements(self.functions, leading_lines=updated.leading_lines).nodes
        return cst.FlattenSentinel([*helpers, updated.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])])


PATCH = Patch(
    id="SP027",
    name="model-runner-v2-by-batch-state",
    version=1,
    title="Worker: recognise Model Runner V2 by its batch state (vLLM 0.34's CPU runner), advise what exists",
    file="speculators/data_generation/custom_worker.py",
    codemod=RecogniseV2ByBatchState,
    facts=(
        VllmFact(
            summary="the CPU worker always builds Model Runner V2 (vllm/v1/worker/cpu/model_runner.py)",
            symbol="CPUWorker (CPUModelRunner from vllm.v1.worker.cpu.model_runner)",
            first_release="0.34.0",
            probe=imports_at_top("vllm/v1/worker/cpu_worker.py", "vllm.v1.worker.cpu.model_runner"),
        ),
    ),
    order=107,
    portable=True,
    risk="capture refuses vLLM 0.34's CPU engine and tells GPU users to set a variable vLLM 0.34 refuses",
    requires=("SP022",),  # rewrites the methods SP022 writes
)

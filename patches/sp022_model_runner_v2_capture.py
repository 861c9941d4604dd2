"""SP022: split captures per request under Model Runner V2 too (worker).

SP010 reads each step's token layout from the V1 model runner's persistent batch
(``input_batch.req_id_to_index``, vllm/v1/worker/gpu_model_runner.py) and stops at capture
setup on any other runner. vLLM's GPU worker builds Model Runner V2
(vllm/v1/worker/gpu/model_runner.py) when ``VLLM_USE_V2_MODEL_RUNNER=1`` from 0.12 and by its
own choice from 0.22 (``VllmConfig.use_v2_model_runner``: Llama on 0.24, every model it
supports from 0.29), so on today's GPU boxes the patched generator stopped unless the job set
the variable to 0, and will not run at all once the V1 runner is removed.

V2 keeps no persistent batch. Each step builds an ``InputBatch``
(vllm/v1/worker/gpu/input_batch.py): ``req_ids`` in batch order -- decodes first, then
prefills by scheduled length, not submission order -- and ``num_scheduled_tokens`` per
request; the step's tokens are laid out in that order (``query_start_loc`` is their cumulative
sum, ``GPUModelRunner.prepare_inputs``). ``execute_model`` keeps that batch in
``self.execute_model_state`` until ``sample_tokens`` takes it: a tuple holding it in 0.12-0.17,
an ``ExecuteModelState`` with ``.input_batch`` from 0.18 (read in every release 0.12-0.33).

The emitted worker code replaces SP010's ``_track_batch_layout`` with one that reads the
step's layout from whichever runner vLLM built (``_step_layout``): V1 exactly as SP010 did;
V2 from the step's ``InputBatch`` right after ``execute_model`` returns, checked against the
scheduler's own token counts. A runner that has neither stops capture setup with one line
naming its class and the variable that selects V1.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.patch import CheckHooks, Patch, PatchCodemod, VllmFact
from patcher.fixes.probes import attribute_stores
from speculators_patch_codemods import capture_methods

CLASS = m.ClassDef(name=m.Name("HiddenStatesWorkerExtension"))
TRACK = m.FunctionDef(name=m.Name("_track_batch_layout"))
STEP_LAYOUT = m.FunctionDef(name=m.Name("_step_layout"))

# What SP022 writes (capture_methods, which SP027 reads too).
METHODS = capture_methods.EITHER_RUNNER


class ModelRunnerV2Capture(PatchCodemod):
    DESCRIPTION = "SP010's _track_batch_layout -> one that reads V1's or Model Runner V2's batch"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if m.findall(
            tree, m.ClassDef(name=CLASS.name, body=m.IndentedBlock(body=[m.ZeroOrMore(), STEP_LAYOUT, m.ZeroOrMore()]))
        ):
            self.already_satisfied("the batch layout is read from either model runner")
        # The one shape accepted: SP010's method as SP010 writes it (a hand-edited copy is refused).
        sp010 = next(
            s
            for s in capture_methods.class_body(capture_methods.PER_REQUEST, tree.default_newline)
            if m.matches(s, TRACK)
        )
        found = [n for n in m.findall(tree, TRACK) if isinstance(n, cst.FunctionDef)]
        if len(found) != 1 or not found[0].deep_equals(sp010.with_changes(leading_lines=found[0].leading_lines)):
            self.refuse(
                found[0] if found else None,
                "class HiddenStatesWorkerExtension with SP010's _track_batch_layout, unedited "
                "(SP022 applies after SP010)",
            )
        return tree.visit(_Rewrite(capture_methods.class_body(METHODS, tree.default_newline)))


class _Rewrite(cst.CSTTransformer):
    def __init__(self, methods: list[cst.BaseStatement]) -> None:
        super().__init__()
        self.methods = methods

    def leave_FunctionDef(self, original, updated):
        if not m.matches(updated, TRACK):
            return updated
        first = self.methods[0].with_changes(leading_lines=updated.leading_lines)
        return cst.FlattenSentinel([first, *self.methods[1:]])


PATCH = Patch(
    id="SP022",
    name="model-runner-v2-capture",
    version=1,
    title="Worker: read each step's batch layout from Model Runner V2 too (vLLM's GPU default)",
    risk="under Model Runner V2 hidden states cannot be attributed to their requests (capture stops at setup)",
    file="speculators/data_generation/custom_worker.py",
    codemod=ModelRunnerV2Capture,
    facts=(
        VllmFact(
            summary="Model Runner V2 keeps each step's InputBatch in execute_model_state (no input_batch)",
            symbol="GPUModelRunner.execute_model_state",
            first_release="0.12.0",
            probe=attribute_stores(
                "vllm/v1/worker/gpu/model_runner.py",
                "GPUModelRunner.execute_model",
                "execute_model_state",
                "input_batch",
            ),
        ),
    ),
    order=105,
    portable=True,
    requires=("SP010",),  # rewrites the method SP010 adds
    checks=CheckHooks(runner_batch="v2", attribution=True),
)

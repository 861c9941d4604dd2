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

from patcher.fixes.patch import Patch, PatchCodemod, VllmFact
from patcher.fixes.probes import attribute_stores
from speculators_patch_codemods.sp010_per_request_capture import METHODS as SP010_METHODS

CLASS = m.ClassDef(name=m.Name("HiddenStatesWorkerExtension"))
TRACK = m.FunctionDef(name=m.Name("_track_batch_layout"))
STEP_LAYOUT = m.FunctionDef(name=m.Name("_step_layout"))

# Methods as they appear in the class (parsed inside it, so docstrings keep their indent).
METHODS = '''\
class HiddenStatesWorkerExtension:

    def _track_batch_layout(self):
        """Record each executed step's requests and token counts in the order of its tokens.

        A step's tokens are laid out in the model runner's batch order, not in submission
        order, and a prompt may be split across steps (chunked prefill). Both of vLLM's GPU
        model runners are read (``_step_layout``).
        """
        runner = self.model_runner  # type: ignore[attr-defined]
        v2 = type(runner).__module__.startswith("vllm.v1.worker.gpu.")
        if not hasattr(runner, "input_batch") and not v2:
            raise RuntimeError(
                "speculators-patch: hidden-state capture cannot read the batch layout of "
                f"{type(runner).__module__}.{type(runner).__name__} (neither V1's input_batch "
                "nor Model Runner V2's execute_model_state): set VLLM_USE_V2_MODEL_RUNNER=0"
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

        V1 (vllm/v1/worker/gpu_model_runner.py) keeps one persistent batch: tokens follow
        input_batch.req_id_to_index. Model Runner V2 (vllm/v1/worker/gpu/model_runner.py)
        builds an InputBatch per step (req_ids, num_scheduled_tokens) and keeps it in
        execute_model_state until sample_tokens: a tuple holding it before vLLM 0.18.
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
                "(execute_model_state): set VLLM_USE_V2_MODEL_RUNNER=0"
            )
        layout = [(req_id, int(n)) for req_id, n in zip(batch.req_ids, batch.num_scheduled_tokens)]
        if dict(layout) != dict(scheduled):
            raise RuntimeError(
                f"Model Runner V2's batch {dict(layout)} differs from the scheduled tokens {dict(scheduled)}"
            )
        return layout
'''


def _methods(code: str, newline: str) -> list[cst.BaseStatement]:
    cls = cst.ensure_type(cst.parse_module(code.replace("\n", newline)).body[0], cst.ClassDef)
    return list(cls.body.body)


class ModelRunnerV2Capture(PatchCodemod):
    DESCRIPTION = "SP010's _track_batch_layout -> one that reads V1's or Model Runner V2's batch"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if m.findall(tree, m.ClassDef(name=CLASS.name, body=m.IndentedBlock(body=[m.ZeroOrMore(), STEP_LAYOUT,
                                                                                 m.ZeroOrMore()]))):
            self.already_satisfied("the batch layout is read from either model runner")
        # The one shape accepted: SP010's method as SP010 writes it (a hand-edited copy is refused).
        sp010 = next(s for s in _methods(SP010_METHODS, tree.default_newline) if m.matches(s, TRACK))
        found = [n for n in m.findall(tree, TRACK) if isinstance(n, cst.FunctionDef)]
        if len(found) != 1 or not found[0].deep_equals(sp010.with_changes(leading_lines=found[0].leading_lines)):
            self.refuse(found[0] if found else None,
                        "class HiddenStatesWorkerExtension with SP010's _track_batch_layout, unedited "
                        "(SP022 applies after SP010)")
        return tree.visit(_Rewrite(_methods(METHODS, tree.default_newline)))


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
            modules=("vllm/v1/worker/gpu/model_runner.py",),
            symbol="GPUModelRunner.execute_model_state",
            first_release="0.12.0",
            probe=attribute_stores("vllm/v1/worker/gpu/model_runner.py", "GPUModelRunner.execute_model",
                                   "execute_model_state", "input_batch"),
        ),
    ),
    order=105,
    portable=True,
    requires=("SP010",),  # rewrites the method SP010 adds
)

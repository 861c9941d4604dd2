"""SP022: the worker reads each step's layout from Model Runner V2's batch as well as V1's."""

from __future__ import annotations

from collections import namedtuple

import pytest
from codemods import codemod, refusal_test, rewrite_test
from worker_fakes import BEFORE, FakeTorch, Rows, Step

from speculators_patch_codemods.capture_methods import EITHER_RUNNER, PER_REQUEST
from speculators_patch_codemods.sp010_per_request_capture import PATCH as SP010
from speculators_patch_codemods.sp022_model_runner_v2_capture import PATCH


def rewrite(patch, src: str) -> tuple[str, str]:
    return codemod(patch, src)[:2]


AFTER_SP010 = rewrite(SP010, BEFORE)[1]
AFTER = rewrite(PATCH, AFTER_SP010)[1]

# The class as SP010 writes it: its _track_batch_layout, then its per-request getter.
PER_REQUEST_GETTER = PER_REQUEST[PER_REQUEST.index("    def _get_captured_states_per_request") :]

REWRITES = [
    pytest.param(
        "SP022",
        PER_REQUEST,
        EITHER_RUNNER + "\n" + PER_REQUEST_GETTER,
        id="SP010's _track_batch_layout replaced by one that reads either runner, the getter kept",
    ),
]

REFUSALS = [
    pytest.param("SP022", BEFORE, "SP010's _track_batch_layout, unedited", id="SP010 not applied"),
    pytest.param(
        "SP022",
        AFTER_SP010.replace(
            'if getattr(execute_model, "_records_batch_layout", False):',
            'if getattr(execute_model, "_records", False):',
        ),
        "SP010's _track_batch_layout, unedited",
        id="SP010's method edited",
    ),
]


test_model_runner_v2_capture = rewrite_test(REWRITES)


@pytest.mark.fast
def test_rewrites_sp010s_method_once() -> None:
    verdict, new = rewrite(PATCH, AFTER_SP010)
    assert verdict == "changed"
    assert new.count("def _track_batch_layout(self):") == 1 and "def _step_layout(self, scheduler_output):" in new
    assert "needs vLLM's V1 GPU model runner" not in new  # SP010's stop on V2 is gone
    assert rewrite(PATCH, new) == ("satisfied", new)  # applying twice equals applying once


def test_on_speculators_0_3_0_after_sp010(pristine_sources) -> None:
    worker = pristine_sources["speculators/data_generation/custom_worker.py"].decode()
    verdict, new = rewrite(PATCH, rewrite(SP010, worker)[1])
    assert verdict == "changed"
    compile(new, "custom_worker.py", "exec")


@pytest.mark.fast
def test_crlf_files_stay_crlf() -> None:
    verdict, new = rewrite(PATCH, AFTER_SP010.replace("\n", "\r\n"))
    assert verdict == "changed" and "\n" not in new.replace("\r\n", "")


test_refuses_anything_but_sp010s_method = refusal_test(REFUSALS)


# The emitted methods at work on stand-ins shaped like vLLM's runners (the real engine runs
# V1 in tests/e2e; V2 runs only on a GPU: selftest --runner v2, docs/selftest.md).


class V2Batch:
    """vllm/v1/worker/gpu/input_batch.py InputBatch: the step's requests in batch order."""

    def __init__(self, layout):
        self.req_ids = [r for r, _ in layout]
        self.num_scheduled_tokens = [n for _, n in layout]  # a numpy int32 array in vLLM


ExecuteModelState = namedtuple("ExecuteModelState", "input_batch attn_metadata hidden_states")  # 0.18+


def v2_runner(make_state, layouts):
    """A runner of module vllm.v1.worker.gpu.model_runner whose execute_model builds the
    next of ``layouts`` (V2 sorts by scheduled length) and keeps it as ``make_state`` does."""
    steps = iter(layouts)

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        self.execute_model_state = make_state(V2Batch(next(steps)))
        return None

    cls = type("GPUModelRunner", (), {"execute_model": execute_model, "model": type("M", (), {"model": None})()})
    cls.__module__ = "vllm.v1.worker.gpu.model_runner"
    return cls()


def extension(runner):
    namespace = {"torch": FakeTorch}
    exec(compile(AFTER.replace("import torch\n", ""), "custom_worker.py", "exec"), namespace)
    ext = namespace["HiddenStatesWorkerExtension"]()
    ext.model_runner = runner
    ext._register_capture_hooks = lambda base_model: None
    ext._setup_hidden_states_capture([0])
    return ext


STATES = [
    pytest.param(lambda batch: (None, batch, None), id="0.12-0.16 tuple"),
    pytest.param(lambda batch: (batch, {}, None, None), id="0.17 tuple"),
    pytest.param(lambda batch: ExecuteModelState(batch, {}, None), id="0.18+ ExecuteModelState"),
]


@pytest.mark.fast
@pytest.mark.parametrize("make_state", STATES)
def test_v2_captures_are_split_in_v2_batch_order_across_chunked_steps(make_state) -> None:
    # Step 1: V2 lays out the short request b (3 tokens) before a's first chunk (4); step 2
    # runs a's last 2 tokens. Submission order was a, b.
    ext = extension(v2_runner(make_state, [[("b", 3), ("a", 4)], [("a", 2)]]))
    ext.model_runner.execute_model(Step({"a": 4, "b": 3}))
    ext.model_runner.execute_model(Step({"a": 2}))
    ext._captured_states = [[Rows(["b0", "b1", "b2", "a0", "a1", "a2", "a3"]), Rows(["a4", "a5", "pad"])]]
    assert ext._get_captured_states(per_request=True) == {
        "b": [["b0", "b1", "b2"]],
        "a": [["a0", "a1", "a2", "a3", "a4", "a5"]],
    }


@pytest.mark.fast
def test_v2_batch_that_disagrees_with_the_scheduler_raises() -> None:
    ext = extension(v2_runner(STATES[2].values[0], [[("a", 3)]]))
    with pytest.raises(RuntimeError, match=r"Model Runner V2's batch \{'a': 3\} differs from the scheduled tokens"):
        ext.model_runner.execute_model(Step({"a": 4}))


@pytest.mark.fast
def test_v2_step_without_a_kept_batch_raises_one_line() -> None:
    ext = extension(v2_runner(lambda batch: None, [[("a", 1)]]))
    with pytest.raises(RuntimeError) as raised:
        ext.model_runner.execute_model(Step({"a": 1}))
    assert "\n" not in str(raised.value) and "kept no input batch" in str(raised.value)


@pytest.mark.fast
def test_v1_runner_keeps_sp010s_behaviour() -> None:
    class InputBatch:
        req_id_to_index = {"b": 0, "a": 1}

    class Runner:
        input_batch = InputBatch()
        model = type("Model", (), {"model": None})()

        def execute_model(self, scheduler_output, intermediate_tensors=None):
            return None

    ext = extension(Runner())
    ext.model_runner.execute_model(Step({"a": 2, "b": 3}))
    ext._captured_states = [[Rows(["b0", "b1", "b2", "a0", "a1"])]]
    assert ext._get_captured_states(per_request=True) == {"b": [["b0", "b1", "b2"]], "a": [["a0", "a1"]]}
    with pytest.raises(RuntimeError, match=r"Scheduled requests not in the batch: \['x'\]"):
        ext.model_runner.execute_model(Step({"x": 1}))


@pytest.mark.fast
def test_a_runner_of_neither_kind_stops_capture_setup_with_one_line() -> None:
    runner = type(
        "TPUModelRunner", (), {"execute_model": lambda self, s: None, "model": type("M", (), {"model": None})()}
    )()
    with pytest.raises(RuntimeError) as raised:
        extension(runner)
    message = str(raised.value)
    assert "\n" not in message and "TPUModelRunner" in message and "VLLM_USE_V2_MODEL_RUNNER=0" in message

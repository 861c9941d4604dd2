"""SP010: the worker records each step's batch layout and can return captures per request."""

from __future__ import annotations

import pytest
from codemods import codemod, noop_test, refusal_test, rewrite_test
from worker_fakes import BEFORE, FakeTorch, Rows, Step

from speculators_patch_codemods.sp010_per_request_capture import METHODS, PATCH

ADDED = METHODS.split("\n", 1)[1]  # the methods as they read inside the class

AFTER = (
    '''\
import torch


class HiddenStatesWorkerExtension:
    def _setup_hidden_states_capture(self, layer_ids):
        self._layer_ids = frozenset(layer_ids)
        self._captured_states = None  # type: ignore[assignment]
        self._batch_layouts = []
        self._track_batch_layout()
        self._register_capture_hooks(self.model_runner.model.model)

    def _reset_capture(self):
        """Reset captured states before starting a new batch"""
        self._captured_states = None
        self._batch_layouts = []

    def _get_captured_states(self, per_request=False):
        """Get the captured hidden states"""
        # Per request id, split by each step's batch layout (batch order, chunked prefill).
        if per_request:
            return self._get_captured_states_per_request()
        result = [torch.cat(t, dim=0) for t in self._captured_states]
        self._captured_states = None
        return result
'''
    + ADDED
)


def rewrite(src: str) -> tuple[str, str]:
    return codemod(PATCH, src)[:2]


REWRITES = [pytest.param("SP010", BEFORE, AFTER, id="layouts recorded, getter split per request on demand")]

NOOPS = [
    pytest.param("SP010", AFTER, id="already split per request"),
    pytest.param(
        "SP010",
        "class HiddenStatesWorkerExtension:\n    def _get_captured_states_per_request(self):\n        return {}\n",
        id="a per-request getter exists",
    ),
]

REFUSALS = [
    pytest.param(
        "SP010",
        BEFORE.replace("        self._captured_states = None\n", "        self._captured_states = []\n").replace(
            "self._captured_states = []", "self._states = []"
        ),
        "expected class HiddenStatesWorkerExtension",
        id="_reset_capture does not reset _captured_states",
    ),
    pytest.param(
        "SP010",
        BEFORE.replace("def _get_captured_states(self):", "def _get_captured_states(self, rank):"),
        "expected class HiddenStatesWorkerExtension",
        id="getter with another signature",
    ),
    pytest.param(
        "SP010",
        BEFORE.replace("class HiddenStatesWorkerExtension", "class OtherExtension"),
        "expected class HiddenStatesWorkerExtension",
        id="other class",
    ),
]


test_per_request_capture = rewrite_test(REWRITES)


def test_per_request_capture_on_speculators_0_3_0(pristine_sources) -> None:
    verdict, new = rewrite(pristine_sources["speculators/data_generation/custom_worker.py"].decode())
    assert verdict == "changed"
    assert "def _get_captured_states(self, per_request=False):" in new
    assert new.count("self._batch_layouts = []") == 2 and "self._track_batch_layout()" in new
    compile(new, "custom_worker.py", "exec")


test_per_request_capture_noop = noop_test(NOOPS)


test_per_request_capture_refuses_unknown_code = refusal_test(REFUSALS)


# The emitted methods at work, on plain Python stand-ins for tensors and the model runner
# (the real engine runs them in tests/e2e).


def emitted_extension(batch_index):
    """The patched class from BEFORE, with a model runner whose batch order is ``batch_index``."""
    namespace = {"torch": FakeTorch}
    exec(compile(AFTER.replace("import torch\n", ""), "custom_worker.py", "exec"), namespace)
    ext = namespace["HiddenStatesWorkerExtension"]()

    class InputBatch:
        req_id_to_index = batch_index

    class Runner:
        input_batch = InputBatch()
        model = type("Model", (), {"model": None})()

        def execute_model(self, scheduler_output, intermediate_tensors=None):
            return None

    ext.model_runner = Runner()
    ext._register_capture_hooks = lambda base_model: None
    ext._setup_hidden_states_capture([0])
    return ext


@pytest.mark.fast
def test_captures_are_split_in_batch_order_across_chunked_steps():
    # Step 1 lays out b (3 tokens) before a (2 of its 4); step 2 runs the rest of a.
    ext = emitted_extension({"b": 0, "a": 1})
    ext.model_runner.execute_model(Step({"a": 2, "b": 3}))
    ext.model_runner.execute_model(Step({"a": 2}))
    ext._captured_states = [[Rows(["b0", "b1", "b2", "a0", "a1"]), Rows(["a2", "a3"])]]
    assert ext._get_captured_states(per_request=True) == {"b": [["b0", "b1", "b2"]], "a": [["a0", "a1", "a2", "a3"]]}
    assert ext._batch_layouts == [] and ext._captured_states is None


@pytest.mark.fast
@pytest.mark.parametrize(
    ("passes", "message"),
    [
        pytest.param([Rows(["a0", "a1", "a2"])], "Captured 1 forward passes for 2 steps", id="a step without capture"),
        pytest.param(
            [Rows(["a0"]), Rows(["a1", "a2"])], "Captured 1 rows for a step of 2 tokens", id="fewer rows than tokens"
        ),
    ],
)
def test_captures_that_disagree_with_the_steps_raise(passes, message):
    ext = emitted_extension({"a": 0})
    ext.model_runner.execute_model(Step({"a": 2}))
    ext.model_runner.execute_model(Step({"a": 1}))
    ext._captured_states = [passes]
    with pytest.raises(RuntimeError, match=message):
        ext._get_captured_states(per_request=True)


@pytest.mark.fast
def test_a_scheduled_request_missing_from_the_batch_raises():
    ext = emitted_extension({"a": 0})
    with pytest.raises(RuntimeError, match=r"Scheduled requests not in the batch: \['x'\]"):
        ext.model_runner.execute_model(Step({"a": 1, "x": 1}))


@pytest.mark.fast
def test_model_runner_v2_stops_capture_setup_with_one_line():
    """A runner without input_batch (vLLM's GPUModelRunnerV2) is named at capture setup."""
    namespace = {"torch": FakeTorch}
    exec(compile(AFTER.replace("import torch\n", ""), "custom_worker.py", "exec"), namespace)
    ext = namespace["HiddenStatesWorkerExtension"]()
    ext.model_runner = type(
        "GPUModelRunnerV2", (), {"execute_model": lambda self, s: None, "model": type("M", (), {"model": None})()}
    )()
    ext._register_capture_hooks = lambda base_model: None
    with pytest.raises(RuntimeError) as raised:
        ext._setup_hidden_states_capture([0])
    message = str(raised.value)
    assert "\n" not in message and message.startswith("speculators-patch: hidden-state capture needs")
    assert "GPUModelRunnerV2 has none" in message and "VLLM_USE_V2_MODEL_RUNNER=0" in message

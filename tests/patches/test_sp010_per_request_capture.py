"""SP010: the worker records each step's batch layout and can return captures per request."""

from __future__ import annotations

import pytest

from patcher.engine import run_codemod
from speculators_patch_codemods.sp010_per_request_capture import METHODS, PATCH

ADDED = METHODS.split("\n", 1)[1]  # the methods as they read inside the class

BEFORE = '''\
import torch


class HiddenStatesWorkerExtension:
    def _setup_hidden_states_capture(self, layer_ids):
        self._layer_ids = frozenset(layer_ids)
        self._captured_states = None  # type: ignore[assignment]
        self._register_capture_hooks(self.model_runner.model.model)

    def _reset_capture(self):
        """Reset captured states before starting a new batch"""
        self._captured_states = None

    def _get_captured_states(self):
        """Get the captured hidden states"""
        result = [torch.cat(t, dim=0) for t in self._captured_states]
        self._captured_states = None
        return result
'''

AFTER = '''\
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
''' + ADDED


def rewrite(src: str) -> tuple[str, str]:
    verdict, new, _ = run_codemod(PATCH, src.encode(), "3.11")
    return verdict, new.decode()


def test_per_request_capture() -> None:
    assert rewrite(BEFORE) == ("changed", AFTER)
    assert rewrite(AFTER) == ("satisfied", AFTER)  # applying twice equals applying once


def test_per_request_capture_on_speculators_0_3_0(pristine_sources) -> None:
    verdict, new = rewrite(pristine_sources["speculators/data_generation/custom_worker.py"].decode())
    assert verdict == "changed"
    assert "def _get_captured_states(self, per_request=False):" in new
    assert new.count("self._batch_layouts = []") == 2 and "self._track_batch_layout()" in new
    compile(new, "custom_worker.py", "exec")


@pytest.mark.parametrize(
    "src",
    [
        pytest.param(AFTER, id="already split per request"),
        pytest.param("class HiddenStatesWorkerExtension:\n"
                     "    def _get_captured_states_per_request(self):\n"
                     "        return {}\n", id="a per-request getter exists"),
    ],
)
def test_per_request_capture_noop(src: str) -> None:
    assert rewrite(src) == ("satisfied", src)


@pytest.mark.parametrize(
    "src",
    [
        pytest.param(BEFORE.replace("        self._captured_states = None\n", "        self._captured_states = []\n"
                                    ).replace("self._captured_states = []", "self._states = []"),
                     id="_reset_capture does not reset _captured_states"),
        pytest.param(BEFORE.replace("def _get_captured_states(self):", "def _get_captured_states(self, rank):"),
                     id="getter with another signature"),
        pytest.param(BEFORE.replace("class HiddenStatesWorkerExtension", "class OtherExtension"), id="other class"),
    ],
)
def test_per_request_capture_refuses_unknown_code(src: str) -> None:
    verdict, new, detail = run_codemod(PATCH, src.encode(), "3.11")
    assert (verdict, new) == ("refused", src.encode())
    assert "expected class HiddenStatesWorkerExtension" in detail

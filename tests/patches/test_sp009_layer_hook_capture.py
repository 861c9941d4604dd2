"""SP009: the replacement forward gives way to forward hooks on the decoder layers."""

from __future__ import annotations

import textwrap

import pytest

from patcher.engine import run_codemod
from speculators_patch_codemods.sp009_layer_hook_capture import HOOK_METHODS, PATCH

# The methods the patch adds, as they read inside the class.
ADDED = HOOK_METHODS.split("\n", 1)[1]

BEFORE = '''\
import logging
import types
from itertools import islice

from vllm.distributed import get_pp_group, get_tp_group
from vllm.sequence import IntermediateTensors


def _patched_forward(self, input_ids, positions, intermediate_tensors=None):
    hidden_states = self.embed_input_ids(input_ids)
    for layer in islice(self.layers, self.start_layer, self.end_layer):
        hidden_states, residual = layer(hidden_states=hidden_states, positions=positions)
    if not get_pp_group().is_last_rank:
        return IntermediateTensors({"hidden_states": hidden_states})
    if get_tp_group().rank_in_group == 0:
        self._extension._store_captured_states([hidden_states])
    return hidden_states


class HiddenStatesWorkerExtension:
    """Worker extension."""

    def _store_captured_states(self, aux_hidden_states):
        self._captured_states = [[h] for h in aux_hidden_states]

    def _setup_hidden_states_capture(self, layer_ids):
        self._layer_ids = frozenset(layer_ids)
        base_model = self.model_runner.model.model
        base_model._extension = self  # noqa: SLF001
        base_model.forward = types.MethodType(_patched_forward, base_model)
        logging.info("capture set up")
'''

AFTER = (
    '''\
import logging

from vllm.distributed import get_tp_group


class HiddenStatesWorkerExtension:
    """Worker extension."""

'''
    + ADDED
    + """
    def _setup_hidden_states_capture(self, layer_ids):
        self._layer_ids = frozenset(layer_ids)
        base_model = self.model_runner.model.model
        self._register_capture_hooks(base_model)
        logging.info("capture set up")
"""
)


def rewrite(src: str) -> tuple[str, str]:
    verdict, new, _ = run_codemod(PATCH, src.encode(), "3.11")
    return verdict, new.decode()


def test_a_forward_that_is_not_0_3_0s_is_refused_not_deleted() -> None:
    """The codemod deletes the replacement forward and replaces the storage method whole: a
    copy that is not speculators 0.3.0's (here a shorter one, as a hand edit leaves it) is
    refused by name and line, never silently lost (issue 30); what it writes is satisfied."""
    verdict, new, detail = run_codemod(PATCH, BEFORE.encode(), "3.11")
    assert (verdict, new) == ("refused", BEFORE.encode())
    assert detail.startswith(f"{PATCH.file}:9: unrecognised code, expected speculators 0.3.0's _patched_forward")
    assert rewrite(AFTER) == ("satisfied", AFTER)  # applying twice equals applying once


def test_layer_hook_capture_on_speculators_0_3_0(pristine_sources) -> None:
    verdict, new = rewrite(pristine_sources["speculators/data_generation/custom_worker.py"].decode())
    assert verdict == "changed"
    assert "_patched_forward" not in new and "types.MethodType" not in new
    assert "from vllm.distributed import get_tp_group\n" in new  # get_pp_group was only for the forward
    assert "import types" not in new and "islice" not in new and "from vllm.sequence" not in new
    assert "self._register_capture_hooks(base_model)" in new
    compile(new, "custom_worker.py", "exec")


@pytest.mark.parametrize(
    "src",
    [
        pytest.param(
            textwrap.dedent("""\
            class HiddenStatesWorkerExtension:
                def _setup_hidden_states_capture(self, layer_ids):
                    base_model = self.model_runner.model.model
                    self._register_capture_hooks(base_model)
            """),
            id="hooks registered, no replacement forward",
        ),
    ],
)
def test_layer_hook_capture_noop(src: str) -> None:
    assert rewrite(src) == ("satisfied", src)


@pytest.mark.parametrize(
    "src",
    [
        pytest.param(
            BEFORE.replace(
                "base_model.forward = types.MethodType(_patched_forward, base_model)",
                "base_model.__call__ = _patched_forward",
            ),
            id="forward bound another way",
        ),
        pytest.param(BEFORE.replace("_store_captured_states(self", "_store(self"), id="storage method renamed"),
        pytest.param("class HiddenStatesWorkerExtension:\n    pass\n", id="no capture at all"),
    ],
)
def test_layer_hook_capture_refuses_unknown_code(src: str) -> None:
    verdict, new, detail = run_codemod(PATCH, src.encode(), "3.11")
    assert (verdict, new) == ("refused", src.encode())
    assert "expected def _patched_forward" in detail

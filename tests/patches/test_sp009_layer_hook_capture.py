"""SP009: the replacement forward gives way to forward hooks on the decoder layers."""

from __future__ import annotations

import pytest
from codemods import codemod, noop_test, refusal_test, rewrite_test

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
    return codemod(PATCH, src)[:2]


@pytest.mark.fast
def test_a_forward_that_is_not_0_3_0s_is_refused_not_deleted() -> None:
    """The codemod deletes the replacement forward and replaces the storage method whole: a
    copy that is not speculators 0.3.0's (here a shorter one, as a hand edit leaves it) is
    refused by name and line, never silently lost (issue 30); what it writes is satisfied."""
    verdict, new, detail = codemod(PATCH, BEFORE)
    assert (verdict, new) == ("refused", BEFORE)
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


# speculators 0.3.0's custom_worker.py cut down to what the patch reads: the replacement
# forward and the storage method exactly as shipped (the codemod checks them, docstrings
# included), and the setup lines that bind them.
SPECULATORS_0_3_0 = '''\
import logging
import types
from itertools import islice

from vllm.distributed import get_pp_group, get_tp_group
from vllm.sequence import IntermediateTensors


def _patched_forward(
    self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None
):
    """Patched forward pass that captures hidden states from specified layers.

    This function is bound to base_model instances via types.MethodType.
    It expects base_model to have an _extension attribute pointing to the
    HiddenStatesWorkerExtension instance.
    """
    if get_pp_group().is_first_rank:
        hidden_states = (
            inputs_embeds
            if inputs_embeds is not None
            else self.get_input_embeddings(input_ids)
        )
        residual = None
    else:
        assert intermediate_tensors is not None
        hidden_states = intermediate_tensors["hidden_states"]
        residual = intermediate_tensors["residual"]

    aux_hidden_states = []
    extension = self._extension  # noqa: SLF001
    # Only capture on TP rank 0 to avoid duplicates
    should_capture = get_tp_group().rank_in_group == 0
    target_layers = extension._layer_ids if should_capture else frozenset()  # noqa: SLF001

    for idx, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer)):
        hidden_states, residual = layer(
            hidden_states=hidden_states, positions=positions, residual=residual
        )
        absolute_layer_idx = self.start_layer + idx

        # Capture intermediate layers (not the last) before norm
        if absolute_layer_idx in target_layers:
            aux_hidden_states.append((hidden_states + residual).clone())

    # Return early if not last PP rank
    if not get_pp_group().is_last_rank:
        return IntermediateTensors(
            {"hidden_states": hidden_states, "residual": residual}
        )

    hidden_states, _ = self.norm(hidden_states, residual)
    if should_capture and aux_hidden_states:
        extension._store_captured_states(aux_hidden_states)  # noqa: SLF001

    return hidden_states


class HiddenStatesWorkerExtension:
    def _store_captured_states(self, aux_hidden_states):
        if self._captured_states is None:  # type: ignore[has-type]
            self._captured_states = [[h] for h in aux_hidden_states]
        else:
            for i, h in enumerate(aux_hidden_states):
                self._captured_states[i].append(h)

    def _setup_hidden_states_capture(self, layer_ids):
        base_model = self.model_runner.model.model
        base_model._extension = self  # noqa: SLF001
        base_model.forward = types.MethodType(_patched_forward, base_model)
'''

HOOKED = (
    """\
import logging

from vllm.distributed import get_tp_group


class HiddenStatesWorkerExtension:
"""
    + ADDED
    + """
    def _setup_hidden_states_capture(self, layer_ids):
        base_model = self.model_runner.model.model
        self._register_capture_hooks(base_model)
"""
)

REWRITES = [
    pytest.param(
        "SP009",
        SPECULATORS_0_3_0,
        HOOKED,
        id="0.3.0's forward gone, its storage replaced by the hooks, imports only it used dropped",
    ),
]

NOOPS = [
    pytest.param(
        "SP009",
        """\
        class HiddenStatesWorkerExtension:
            def _setup_hidden_states_capture(self, layer_ids):
                base_model = self.model_runner.model.model
                self._register_capture_hooks(base_model)
        """,
        id="hooks registered, no replacement forward",
    ),
]

REFUSALS = [
    pytest.param(
        "SP009",
        BEFORE.replace(
            "base_model.forward = types.MethodType(_patched_forward, base_model)",
            "base_model.__call__ = _patched_forward",
        ),
        "expected def _patched_forward",
        id="forward bound another way",
    ),
    pytest.param(
        "SP009",
        BEFORE.replace("_store_captured_states(self", "_store(self"),
        "expected def _patched_forward",
        id="storage method renamed",
    ),
    pytest.param(
        "SP009",
        "class HiddenStatesWorkerExtension:\n    pass\n",
        "expected def _patched_forward",
        id="no capture at all",
    ),
    pytest.param(
        "SP009",
        SPECULATORS_0_3_0.replace("(hidden_states + residual).clone()", "(hidden_states + residual).cpu()"),
        "speculators 0.3.0's _patched_forward, unedited (SP009 removes it)",
        id="a hand edit in 0.3.0's forward",
    ),
]


test_layer_hook_capture = rewrite_test(REWRITES)


test_layer_hook_capture_noop = noop_test(NOOPS)


test_layer_hook_capture_refuses_unknown_code = refusal_test(REFUSALS)

"""What the capture patches' tests share (SP010, SP022): the worker extension as speculators
0.3.0 writes it (``BEFORE``, trimmed to what the patches touch), and plain Python stand-ins
for tensors and steps that the emitted methods run on (the real engine runs them in tests/e2e)."""

from __future__ import annotations

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


class Rows(list):
    """A list of row labels standing in for a [tokens, hidden] tensor."""

    @property
    def shape(self):
        return (len(self),)

    def __getitem__(self, index):
        got = super().__getitem__(index)
        return Rows(got) if isinstance(index, slice) else got


class FakeTorch:
    @staticmethod
    def cat(chunks, dim=0):
        return Rows(row for chunk in chunks for row in chunk)


class Step:
    def __init__(self, num_scheduled_tokens):
        self.num_scheduled_tokens = num_scheduled_tokens

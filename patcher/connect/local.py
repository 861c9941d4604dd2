"""The agent on this machine: the bootstrap (``patcher/agent/bootstrap.py``) under
speculators-patch's own Python resolves ``--target`` by the same rule as on a remote host
(docs/ARCHITECTURE.md: "Which interpreter a target is") and starts the agent there."""

from __future__ import annotations

import os
import sys

from patcher.connect.bootstrapped import BootstrapTransport
from patcher.connect.program import bootstrap_program
from patcher.connect.transport import Transport
from patcher.errors import UserError


class LocalTransport(BootstrapTransport):
    """The agent under a local interpreter, chosen by the bootstrap from ``target``.

    Args:
        target: ``--target`` (a venv or conda prefix, a site-packages directory, a Python
            interpreter), or None for the active environment (``$VIRTUAL_ENV``, then
            ``$CONDA_PREFIX``, else the Python speculators-patch runs under).
    A target the rule refuses is a ``UserError`` from the first request.
    """

    EXIT_WAIT = Transport.EXIT_WAIT

    def __init__(self, target: str | None = None) -> None:
        self.label = "local"
        super().__init__(target)
        self._header_where = None  # local messages name no host
        self._where = f"--target {target}" if target else "the default interpreter"
        # True: nothing names a target, so the agent runs under this tool's own Python, and an
        # error about a missing speculators should say so (``commands.session``).
        self.tool_env = target is None and not any(os.environ.get(v) for v in ("VIRTUAL_ENV", "CONDA_PREFIX"))

    def _argv(self) -> list[str]:
        return [sys.executable, "-I", "-S", "-c", bootstrap_program()]

    def __enter__(self) -> "LocalTransport":
        try:
            return super().__enter__()
        except OSError as e:  # this tool's own interpreter, which runs the bootstrap, cannot be started
            raise UserError(f"cannot start {sys.executable} (the Python speculators-patch runs under, which "
                            f"starts the agent): {e.strerror}; nothing was read or changed") from None

    def _where_text(self) -> str:
        return f"{self.label}: {self._where}"

    def _no_answer(self, op: str) -> str:
        return Transport._no_answer(self, op)

    def _not_json(self, line: bytes) -> str:
        return Transport._not_json(self, line)

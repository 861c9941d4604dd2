"""The agent on this machine. ``--target`` is resolved by the same rule as on a remote host,
the bootstrap's ``resolve`` (``patcher/agent/bootstrap.py``; docs/ARCHITECTURE.md: "Which
interpreter a target is"), called here in-process rather than in one more interpreter."""

from __future__ import annotations

import os

from patcher.agent import bootstrap
from patcher.connect.program import AGENT_PROGRAM
from patcher.connect.transport import Transport
from patcher.errors import UserError


class LocalTransport(Transport):
    """The agent under the local interpreter that ``target`` names.

    Args:
        target: ``--target`` (a venv or conda prefix, a site-packages directory, a Python
            interpreter), or None for the active environment (``$VIRTUAL_ENV``, then
            ``$CONDA_PREFIX``, else the Python speculators-patch runs under).
    Raises ``UserError`` (one line, nothing started) for a target the rule refuses.
    """

    def __init__(self, target: str | None = None) -> None:
        super().__init__()
        try:
            self.python, self._flags, self.site_packages = bootstrap.resolve(target)
        except bootstrap.Refused as e:
            raise UserError(str(e)) from None
        # True: nothing names a target, so the agent runs under this tool's own Python, and an
        # error about a missing speculators should say so (``commands.session``).
        self.tool_env = target is None and not any(os.environ.get(v) for v in ("VIRTUAL_ENV", "CONDA_PREFIX"))

    def _argv(self) -> list[str]:
        return bootstrap.agent_argv(self.python, self._flags, self.site_packages, AGENT_PROGRAM, self._marker.decode())

    def _env(self) -> dict[str, str]:
        return bootstrap.agent_environment(os.environ)

    def __enter__(self) -> "LocalTransport":
        try:
            return super().__enter__()
        except OSError as e:  # e.g. an interpreter this user may not run
            raise UserError(f"cannot start {self.python}: {e.strerror}; nothing was read or changed") from None

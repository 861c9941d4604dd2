"""Transports that start the agent through the bootstrap (``patcher/agent/bootstrap.py``):
SSH (``connect.ssh``) and ``--exec`` (``connect.exec``). The first bytes on the far side's
stdin are a header -- the target, the agent program, a marker -- and the bootstrap resolves
the target there, by the rule a local target is resolved by (``bootstrap.resolve``)."""

from __future__ import annotations

import json
import subprocess

from patcher.connect.program import AGENT_PROGRAM
from patcher.connect.transport import Transport


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class BootstrapTransport(Transport):
    """A transport whose process runs ``BOOTSTRAP`` on the far side's Python: the first
    bytes on its stdin are the header (``--target``, the agent's source, a marker), and
    everything it prints before the marker line is skipped. Subclasses set ``label`` before
    calling ``__init__``, ``_header_where`` (the place the far side names in its messages),
    ``_where`` (the place the client names) and ``_argv``."""

    EXIT_WAIT = 60  # a remote agent may still be finishing a commit

    def __init__(self, target: str | None) -> None:
        super().__init__()
        self.target = target
        self._where = self._header_where = self.label

    def __enter__(self) -> "BootstrapTransport":
        super().__enter__()
        header = json.dumps(
            {
                "target": self.target,
                "agent": AGENT_PROGRAM,
                "where": self._header_where,
                "marker": self._marker.decode(),
            }
        ).encode()
        # Written with the first request, back to back: starting the agent costs no round trip.
        self._preamble = b"%d\n" % len(header) + header
        self._header_size = b"%d" % len(header)
        return self

    def _where_text(self) -> str:
        return self._where

    def _is_echo(self, line: bytes) -> bool:
        """Also the header's length line coming back (``cat`` sends it first)."""
        return super()._is_echo(line) or line.rstrip(b"\r\n") == self._header_size

    def _consumed(self, line: bytes) -> bool:
        """The bootstrap's ``MARKER exec PYTHON`` line: the far side started and chose PYTHON."""
        prefix = self._marker + b" exec "
        if line.startswith(prefix):
            self.resolved = line[len(prefix) :].rstrip(b"\r\n").decode(errors="replace")
            return True
        return False

    def _no_answer(self, op: str) -> str:
        if not self._synced and self.resolved is not None:  # the target's interpreter, not the connection
            code = self._exit_code()
            said = last_line(self.stderr_text()) or last_line(b"".join(self._noise).decode(errors="replace"))
            return (
                f"{self._where}: {self.resolved} (the target's interpreter there) ended (status {code}) without "
                f"starting the agent: {said[:200] or 'no output'}; is it a Python 3.8+ interpreter?"
            )
        return self._failure(op)

    def _not_json(self, line: bytes) -> str:
        return f"{self._where}: unexpected output from the remote agent: {line[:200]!r}"

    def _exit_code(self) -> int:
        assert self._proc is not None
        try:
            return self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._kill()
            return self._proc.wait()

    def _failure(self, op: str) -> str:
        raise NotImplementedError

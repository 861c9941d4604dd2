"""How requests reach the agent (``patcher/agent/``) running under the target's Python.

A transport starts one agent process per subcommand and exchanges JSON lines with it:
locally a subprocess of the target's interpreter (``connect.local``); remotely the same
agent over one SSH connection (``connect.ssh``) or a command's pipes (``connect.exec``),
both started by the bootstrap (``connect.bootstrapped``). Every side resolves ``--target``
by one rule, ``patcher/agent/bootstrap.py``'s ``resolve``. Every transport counts its
exchanges, so round trips can be reported.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import subprocess
import threading
import time
from typing import Callable

from patcher.errors import Interrupted, UserError, interruption
from patcher.ways import Way

# Seconds to wait for the far side to start the agent (``--connect-timeout``): for SSH the
# connection, authentication and the remote shell; for ``--exec`` the command's start;
# locally the interpreter's. Seconds to wait for each answer once it runs (``--timeout``):
# the longest exchange is a commit waiting for another run's lock (the agent gives up
# after 120 s) on a slow file system. Measured figures: docs/design.md (timeouts).
DEFAULT_CONNECT_TIMEOUT = 30.0
DEFAULT_TIMEOUT = 600.0


class _Deadline(Exception):
    """No line from the far side before the deadline."""


class Transport:
    """A live agent process. Use as a context manager; ``request`` is one exchange.

    Every wait is bounded: ``connect_timeout`` seconds for the agent to start (its marker
    line, the handshake), ``timeout`` seconds for each answer; past either, ``request``
    raises ``UserError`` naming what did not answer. A far side that sends our own bytes
    back (an ``--exec`` command that is ``cat``, a shell that echoes) is told at once."""

    label = "local"

    # Lines the agent's children write to stderr with this prefix are progress for the user
    # (selftest); they are passed to ``on_progress`` as they arrive.
    PROGRESS_PREFIX = b"[selftest] "
    # Lines the agent itself writes to stderr with this prefix (``agent.common.NOTICE_PREFIX``:
    # a wait for the install's lock, naming its holder) are for the user at once: passed to
    # ``on_notice``, which prints them on stderr after the target's label.
    NOTICE_PREFIX = b"[speculators-patch] "
    # True: the process runs in a session of its own, so that a command that gives up on it
    # ends everything it started, not only the first process (``--exec``: a wrapper's
    # children); a Ctrl-C on the terminal is passed on to that group. False (a local agent,
    # ssh): it stays in the caller's group, which the terminal's Ctrl-C (and a kill of the
    # whole group) reaches as it reaches the caller; ssh's connection master (``--ssh-persist``)
    # must outlive the run.
    OWN_GROUP = False
    # Seconds to wait, past --timeout, for the answer to a commit that holds the install's lock
    # (the agent gives up waiting for the lock before --timeout, ``lock_wait``): it is writing,
    # and the command reports what it did rather than leave it running.
    COMMIT_GRACE = 60

    def __init__(self) -> None:
        self.exchanges = 0
        self.on_progress: Callable[[str], None] | None = None
        self.on_notice: Callable[[str], None] = self._print_notice
        self.connect_timeout = DEFAULT_CONNECT_TIMEOUT
        self.timeout = DEFAULT_TIMEOUT
        self._proc: subprocess.Popen[bytes] | None = None
        self._writer: threading.Thread | None = None  # the last write to the agent's stdin
        self._stderr: list[bytes] = []
        self._drain: threading.Thread | None = None
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._marker = f"speculators-patch-agent-{secrets.token_hex(8)}".encode()
        self._synced = False
        self._noise: list[bytes] = []  # what the far side printed before the marker
        self.resolved: str | None = None  # the interpreter a bootstrap chose, once it says so
        self._started = 0.0
        self._preamble = b""  # bytes to write before the first request (a bootstrap's header)

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        return None

    def __enter__(self) -> "Transport":
        self._started = time.monotonic()
        self._proc = subprocess.Popen(
            self._argv(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env(),
            start_new_session=self.OWN_GROUP,
        )
        # Drain stderr as it comes: a long child (selftest) would otherwise block on a full
        # pipe, and an SSH ControlPersist master may keep it open after ssh exits. Stdout is
        # read by a thread too, so that every wait for a line can be bounded.
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        return self

    def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in iter(self._proc.stdout.readline, b""):
            self._lines.put(line)
        self._lines.put(b"")  # end of output

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in iter(self._proc.stderr.readline, b""):
            if self.on_progress is not None and line.startswith(self.PROGRESS_PREFIX):
                self.on_progress(line[len(self.PROGRESS_PREFIX) :].decode(errors="replace").rstrip())
            elif line.startswith(self.NOTICE_PREFIX):
                self.on_notice(line[len(self.NOTICE_PREFIX) :].decode(errors="replace").rstrip())
            else:
                self._stderr.append(line)

    def _print_notice(self, line: str) -> None:
        import sys

        try:
            sys.stderr.write(f"{self.label}: {line}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the agent and everything it started (its process group)."""
        if self._proc is None:
            return
        if self.OWN_GROUP:
            try:
                os.killpg(self._proc.pid, sig)
                return
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self._proc.send_signal(sig)
        except (ProcessLookupError, OSError):
            pass

    def lock_wait(self) -> float:
        """Seconds the agent may wait for the install's lock: what ``timeout`` leaves for the
        answer to arrive after the agent gave up (half of it, at most 5 s), so that a command
        that gives up has never left an agent waiting to write."""
        return max(0.0, self.timeout - min(5.0, self.timeout / 2))

    def stderr_text(self) -> str:
        """What the agent (and its children) wrote to stderr so far, progress lines excluded."""
        if self._drain is not None and self._proc is not None and self._proc.poll() is not None:
            self._drain.join(timeout=2)
        return b"".join(self._stderr).decode(errors="replace")

    # Seconds to wait for the agent to exit once its stdin is closed, before killing it.
    EXIT_WAIT = 10

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        if self.OWN_GROUP and exc and isinstance(exc[1], KeyboardInterrupt) and self._proc.poll() is None:
            self._kill(signal.SIGINT)  # Ctrl-C: what the terminal would have sent it in our group
        if self._writer is None or not self._writer.is_alive():  # else a stuck write keeps the descriptor
            try:
                self._proc.stdin.close()
            except (BrokenPipeError, OSError):  # the agent is already gone; its error was reported
                pass
        try:
            self._proc.wait(timeout=self.EXIT_WAIT)
        except subprocess.TimeoutExpired:
            self._kill()
            self._proc.wait()

    def _write(self, data: bytes, deadline: float) -> None:
        """Write and flush ``data`` to the agent's stdin by ``deadline`` (a far side that
        does not read would block a plain write for ever). Raises ``BrokenPipeError`` when
        it has ended, ``_Deadline`` when the write did not complete in time."""
        failure: list[BaseException] = []

        fd = self._proc.stdin.fileno()

        def write() -> None:
            # os.write on the descriptor, not the buffered file: a write blocked on a far side
            # that never reads (a forked child holding the pipe) then holds no lock that
            # closing stdin in __exit__ would wait on for ever.
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except (BrokenPipeError, ValueError, OSError) as e:
                failure.append(e)

        writer = self._writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(max(0.0, deadline - time.monotonic()))
        if writer.is_alive():
            raise _Deadline()
        if failure:
            raise BrokenPipeError(str(failure[0]))

    def _next_line(self, deadline: float) -> bytes:
        try:
            return self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise _Deadline() from None

    def _handshake_deadline(self) -> float:
        return self._started + self.connect_timeout

    def request(self, op: str, **payload: object) -> dict:
        """Send one request; return the agent's answer. Raises ``UserError`` on failure,
        ``Interrupted`` on Ctrl-C (saying whether a commit in flight was finished)."""
        return self.request_then(op, [], **payload)[0]

    def request_then(self, op: str, ahead: list[dict], **payload: object) -> tuple[dict, list[dict]]:
        """``request``, with the requests ``ahead`` run by the agent right after this one
        succeeds (``{"op": ..., **payload}`` each): the answer, and theirs (``{"ok": ...}`` or
        ``{"error": ...}`` each, maybe fewer) from the same line."""
        assert self._proc is not None and self._proc.stdin and self._proc.stdout
        message = {"op": op, **payload}
        if ahead:
            message["then"] = ahead
        self.exchanges += 1
        if op in ("inspect", "commit", "repair"):  # those that may wait for the install's lock
            message["lock_wait"] = self.lock_wait()
        wait = self.timeout
        if op == "run_python":  # the agent bounds its child by the request's own timeout
            wait = max(wait, float(payload.get("timeout") or 600) + 60)
        try:
            line = self._exchange(op, json.dumps(message).encode() + b"\n", wait)
        except KeyboardInterrupt:
            if op != "commit":
                if self.OWN_GROUP and self._proc.poll() is None:
                    self._kill(signal.SIGINT)
                raise
            raise Interrupted(self._interrupted_commit()) from None
        if not line:
            raise UserError(self._no_answer(op))
        try:
            answer = json.loads(line)
        except ValueError:
            self._kill()
            raise UserError(self._not_json(line)) from None
        if "error" in answer:
            raise UserError(answer["error"])
        return answer["ok"], list(answer.get("then") or [])

    def _exchange(self, op: str, data: bytes, wait: float) -> bytes:
        """Write one request and read its answer line (b"" when the agent ended first)."""
        data, self._preamble = self._preamble + data, b""
        try:
            try:
                self._write(data, self._handshake_deadline() if not self._synced else time.monotonic() + wait)
            except BrokenPipeError:  # it ended first; what it said before ending (a refusal) still counts
                pass
            if not self._sync():
                return b""
            return self._next_line(time.monotonic() + wait)
        except _Deadline:
            if op == "commit" and self._synced:
                return self._late_commit(wait)
            raise UserError(self._timed_out(op, wait)) from None

    def _late_commit(self, wait: float) -> bytes:
        """A commit that did not answer within ``wait`` seconds holds the lock (the agent
        gives up waiting for it before then) and is writing: wait ``COMMIT_GRACE`` more for
        its answer, which the command then reports. Past that, end the agent: a local one's
        commit is then rolled back by the next command; a remote one may still finish."""
        self.on_notice(
            f"no answer to the commit within {wait:g} s (--timeout): it holds the lock and is writing; "
            f"waiting up to {self.COMMIT_GRACE} s more for it to finish"
        )
        try:
            return self._next_line(time.monotonic() + self.COMMIT_GRACE)
        except _Deadline:
            raise UserError(self._timed_out("commit", wait + self.COMMIT_GRACE)) from None

    def _sync(self) -> bool:
        """Skip what the far side prints before the agent's marker line (login banners, a
        shell's rc files), within ``connect_timeout``. False when it ended first. Raises
        ``UserError`` when it sends back our own bytes (it echoes instead of running
        Python), ``_Deadline`` past ``connect_timeout``."""
        while not self._synced:
            line = self._next_line(self._handshake_deadline())
            if not line:
                return False
            if self._consumed(line):
                continue
            if self._is_echo(line):
                self._kill()
                raise UserError(self._echoed())
            self._noise.append(line)
            self._synced = line.rstrip(b"\r\n") == self._marker
        return True

    def _consumed(self, line: bytes) -> bool:
        """A line before the marker that is ours to read, not the far side's noise (none here)."""
        return False

    def _is_echo(self, line: bytes) -> bool:
        """A line carrying our marker inside other text (the header or a request sent back),
        or starting like a request: the far side echoes its input."""
        stripped = line.rstrip(b"\r\n")
        return (self._marker in line and stripped != self._marker) or stripped.startswith(b'{"op": ')

    def _echoed(self) -> str:
        return (
            f"{self._where_text()}: it sent our own input back instead of running the agent (a command that "
            f"echoes, such as cat or a shell reading stdin); nothing reached a Python, nothing changed"
        )

    def _where_text(self) -> str:
        return f"{self.label}: {self._argv()[0]}"

    def _timed_out(self, op: str, wait: float) -> str:
        """The one line for a far side that did not answer in time; the process (with its
        group, ``OWN_GROUP``) is killed. A commit gets here only past ``COMMIT_GRACE`` too."""
        where = self._where_text()
        if not self._synced:
            self._kill()
            seconds = self.connect_timeout
            if self.resolved is not None:
                what = f"{self.resolved} (the target's interpreter there) started, but not the agent"
            elif not self._noise and not self.stderr_text().strip():
                what = (
                    "it printed nothing and was still running (silent: not a Python that runs the program given "
                    "to it? if it is only slow to start, raise --connect-timeout)"
                )
            else:
                last = (
                    b"".join(self._noise).decode(errors="replace").strip().splitlines()
                    or self.stderr_text().strip().splitlines()
                    or [""]
                )[-1]
                what = f"it printed output but never started the agent (last: {last[:120]!r})"
            return (
                f"{where}: no answer within {seconds:g} s (--connect-timeout) while starting the agent: {what}; "
                f"nothing was sent to the target, nothing changed"
            )
        self._kill()
        if op == "commit":
            return (
                f"{where}: no answer to the commit within {wait:g} s (--timeout and the wait for a commit in "
                f"progress); its agent was stopped: a commit that had started is finished (past its commit "
                f"point) or rolled back by the next speculators-patch command on the target (one that reached a "
                f"remote target may still finish there): run `{Way('status')}` to see which"
            )
        return f"{where}: no answer to {op} within {wait:g} s (--timeout); nothing was written by this run"

    # Seconds to wait, after Ctrl-C, for the answer to a commit in flight (a second Ctrl-C stops waiting).
    INTERRUPT_WAIT = 30

    def _interrupted_commit(self) -> str:
        """After Ctrl-C during a commit: wait for its answer (the agent ignores SIGINT and
        hang-ups once it has the request), and say what happened in one line."""
        where = self._where_text()
        try:
            line = self._next_line(time.monotonic() + self.INTERRUPT_WAIT)
        except (_Deadline, KeyboardInterrupt):
            line = None
        try:
            answer = json.loads(line) if line else None
        except ValueError:
            answer = None
        if isinstance(answer, dict) and "ok" in answer:
            written = answer["ok"].get("written") or []
            return (
                f"interrupted ({interruption()}) while {where} was committing; the commit was finished first: "
                f"{len(written)} file(s) written ({', '.join(written)})"
            )
        if isinstance(answer, dict) and "error" in answer:
            return (
                f"interrupted ({interruption()}) while {where} was committing; the commit did not happen "
                f"({answer['error']}); nothing changed"
            )
        return (
            f"interrupted ({interruption()}) while {where} was committing; its outcome is not known here: a commit "
            f"that reached the target finishes or rolls back there by itself; run `{Way('status')}` "
            f"to see which"
        )

    def _no_answer(self, op: str) -> str:
        """The one-line message when the agent ended without answering ``op``."""
        printed = [n for n in self._noise if n.strip()]
        if not self._synced and printed:  # something that is not our agent talked back
            self._kill()
            return self._not_json(printed[0])
        try:
            self._proc.wait(timeout=self.EXIT_WAIT)
        except subprocess.TimeoutExpired:
            pass
        code = self._proc.returncode
        if code is not None and code < 0:  # killed (the OOM killer, kill -9): no interpreter's fault
            during = "while committing" if op == "commit" else "while reading"
            return (
                f"{self._where_text()}: the agent was killed (signal {-code}) {during}; the next speculators-patch "
                f"command on that target finishes a commit it had started past its commit point, or rolls it back"
            )
        err = self.stderr_text().strip().splitlines()
        # The interpreter hint only where the failure looks like one (no output, or Python
        # 2 / a shell choking on the agent's source), not after e.g. a full disk.
        hint = not err or any(w in err[-1] for w in ("SyntaxError", "not found", "command", "invalid syntax"))
        return (
            f"{self._where_text()} ended without answering the agent's request "
            f"({err[-1] if err else 'no output'})" + ("; is it a Python 3.8+ interpreter?" if hint else "")
        )

    def _not_json(self, line: bytes) -> str:
        return (
            f"{self._where_text()} did not answer as a Python interpreter running the agent "
            f"(it printed {line[:60].decode(errors='replace').strip()!r})"
        )

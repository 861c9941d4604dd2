"""How requests reach the agent (``patcher/target/agent.py``) running under the target's Python.

A transport starts one agent process per subcommand and exchanges JSON lines with it:
locally a subprocess of the target's interpreter; remotely (``patcher.ssh``) the same
agent over one SSH connection. Both count exchanges, so round trips can be reported.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from patcher.errors import UserError

AGENT_SOURCE = (Path(__file__).parent / "target" / "agent.py").read_text(encoding="utf-8")

# Compiling the agent (1,500 lines) took ~20 ms of the target's CPU on every run, the
# largest part of the agent's start. Like Python's own __pycache__, the compiled code is
# kept on the machine that runs it, in ~/.cache/speculators-patch/agent (0700), named by
# the source's sha256 and the interpreter's cache tag, written atomically; a cache that
# cannot be read or written only means compiling again. Runs the agent in the caller's
# globals, so ``__name__ == "__main__"`` starts it, as running the source itself did.
_LOADER = r'''
import marshal as _marshal, os as _os, sys as _sys
def _agent_code(source, digest):
    tag = getattr(_sys.implementation, "cache_tag", None)
    folder = _os.path.join(_os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache"),
                           "speculators-patch", "agent")
    path = _os.path.join(folder, "%s.%s.bin" % (digest, tag))
    if tag:
        try:
            with open(path, "rb") as f:
                return _marshal.load(f)
        except (OSError, EOFError, ValueError, TypeError):
            pass
    code = compile(source, "agent.py", "exec")
    if tag:
        tmp = "%s.%d.tmp" % (path, _os.getpid())
        try:
            _os.makedirs(folder, mode=0o700, exist_ok=True)
            with open(tmp, "wb") as f:
                _marshal.dump(code, f)
            _os.replace(tmp, path)
        except OSError:
            try:
                _os.unlink(tmp)
            except OSError:
                pass
    return code
exec(_agent_code(SOURCE, DIGEST), globals())
'''
AGENT_PROGRAM = _LOADER.replace("DIGEST", repr(hashlib.sha256(AGENT_SOURCE.encode()).hexdigest())).replace(
    "SOURCE", repr(AGENT_SOURCE))
"""What ``python -c`` runs: the agent, from the target machine's compiled-code cache."""


class Transport:
    """A live agent process. Use as a context manager; ``request`` is one exchange."""

    label = "local"

    # Lines the agent's children write to stderr with this prefix are progress for the user
    # (selftest); they are passed to ``on_progress`` as they arrive.
    PROGRESS_PREFIX = b"[selftest] "

    def __init__(self) -> None:
        self.exchanges = 0
        self.on_progress: Callable[[str], None] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: list[bytes] = []
        self._drain: threading.Thread | None = None

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        return None

    def __enter__(self) -> "Transport":
        self._proc = subprocess.Popen(
            self._argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self._env()
        )
        # Drain stderr as it comes: a long child (selftest) would otherwise block on a full
        # pipe, and an SSH ControlPersist master may keep it open after ssh exits.
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        return self

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in iter(self._proc.stderr.readline, b""):
            if self.on_progress is not None and line.startswith(self.PROGRESS_PREFIX):
                self.on_progress(line[len(self.PROGRESS_PREFIX):].decode(errors="replace").rstrip())
            else:
                self._stderr.append(line)

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
        try:
            self._proc.stdin.close()
        except BrokenPipeError:  # the agent is already gone; its error was reported
            pass
        try:
            self._proc.wait(timeout=self.EXIT_WAIT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def request(self, op: str, **payload: object) -> dict:
        """Send one request; return the agent's answer. Raises ``UserError`` on failure."""
        assert self._proc is not None and self._proc.stdin and self._proc.stdout
        self.exchanges += 1
        try:
            self._proc.stdin.write(json.dumps({"op": op, **payload}).encode() + b"\n")
            self._proc.stdin.flush()
            line = self._read_answer_line()
        except BrokenPipeError:  # it ended first; what it said before ending (a bootstrap's refusal) still counts
            line = self._read_answer_line()
        if not line:
            raise UserError(self._no_answer(op))
        try:
            answer = json.loads(line)
        except ValueError:
            self._proc.kill()
            raise UserError(self._not_json(line)) from None
        if "error" in answer:
            raise UserError(answer["error"])
        return answer["ok"]

    def _read_answer_line(self) -> bytes:
        return self._proc.stdout.readline()

    def _no_answer(self, op: str) -> str:
        """The one-line message when the agent ended without answering ``op``."""
        try:
            self._proc.wait(timeout=self.EXIT_WAIT)
        except subprocess.TimeoutExpired:
            pass
        err = self.stderr_text().strip().splitlines()
        # The interpreter hint only where the failure looks like one (no output, or Python
        # 2 / a shell choking on the agent's source), not after e.g. a full disk.
        hint = not err or any(w in err[-1] for w in ("SyntaxError", "not found", "command", "invalid syntax"))
        return (f"{self.label}: {self._argv()[0]} ended without answering the agent's request "
                f"({err[-1] if err else 'no output'})" + ("; is it a Python 3.8+ interpreter?" if hint else ""))

    def _not_json(self, line: bytes) -> str:
        return (f"{self.label}: {self._argv()[0]} did not answer as a Python interpreter running the agent "
                f"(it printed {line[:60].decode(errors='replace').strip()!r})")


class LocalTransport(Transport):
    """The agent under a local interpreter.

    Args:
        python: the interpreter of the target environment.
        site_packages: set when the target is a bare site-packages directory; the agent then
            runs isolated (``-I -S``) and adds that directory itself.
    """

    def __init__(self, python: str, site_packages: str | None = None) -> None:
        super().__init__()
        self.python = python
        self.site_packages = site_packages

    def _argv(self) -> list[str]:
        flags = ["-I", "-S"] if self.site_packages else []
        return [self.python, *flags, "-c", AGENT_PROGRAM]

    def _env(self) -> dict[str, str]:
        # The caller's PYTHONPATH must not decide which tree is patched (the state would go
        # to the target's site-packages while another tree is rewritten).
        return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _is_site_packages(path: Path) -> bool:
    return path.name in ("site-packages", "dist-packages") or any(path.glob("*.dist-info"))


def local_transport(target: str | None) -> tuple[LocalTransport, str | None]:
    """Resolve ``--target`` to a transport; return it and the bare site-packages path, if any.

    ``target`` may be None (the active environment: ``$VIRTUAL_ENV``, ``$CONDA_PREFIX``,
    else this interpreter), a venv or conda prefix, a site-packages directory, or a Python
    interpreter. Raises ``UserError`` for anything else.
    """
    if target is not None and (not target.strip() or "\0" in target):
        raise UserError("--target is empty" if not target.strip() else "--target contains a NUL byte")
    if target is None:
        for variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
            prefix = os.environ.get(variable)
            if prefix:
                python = Path(prefix) / "bin" / "python"
                if not python.exists():
                    raise UserError(f"${variable} is {prefix}, which has no bin/python; pass --target")
                return LocalTransport(str(python)), None
        return LocalTransport(sys.executable), None
    path = Path(target).expanduser()
    try:
        if not path.exists():
            raise UserError(f"target does not exist: {target}")
        if path.is_file():
            # Nothing is sent to a program before we know it is Python (not bash, not a script).
            names = {path.name, Path(os.path.realpath(path)).name}
            if not os.access(path, os.X_OK) or not any(re.match(r"(python|pypy)[0-9.]*$", n) for n in names):
                raise UserError(f"target is a file but not a Python interpreter (python3, python3.X): {target}")
            return LocalTransport(str(path)), None
        os.listdir(path)  # a directory this user cannot read or traverse fails here, in one line
        for candidate in (path / "bin" / "python", path / "bin" / "python3"):
            if candidate.exists():
                return LocalTransport(str(candidate)), None
        if _is_site_packages(path):
            return LocalTransport(sys.executable, str(path.resolve())), str(path.resolve())
    except OSError as e:
        raise UserError(f"cannot read target {target}: {e.strerror}") from None
    raise UserError(
        f"target is not a Python environment (no bin/python), site-packages directory or interpreter: {target}"
    )

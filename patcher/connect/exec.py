"""``--exec 'CMD ...'``: the agent through any command that connects its stdin/stdout to a
Python on the other side (``docker exec -i NAME python3``, ``kubectl exec -i POD --
python3``, ``podman exec -i NAME python3``, ``env -i /opt/env/bin/python``).

The command is split with ``shlex.split`` and run as an argument vector (no shell on our
side); the bootstrap (``patcher/agent/bootstrap.py``) that SSH sends is appended as ``-c PROGRAM`` (one
argument, base64 inside: no quotes or newlines for any layer to mangle), so the command's
last words must start the Python itself. From there the exchange is the SSH one: header,
marker, JSON lines; ``--target`` is resolved on the far side; planning stays here.
"""

from __future__ import annotations

import shlex

from patcher.connect.bootstrapped import BootstrapTransport, last_line
from patcher.connect.program import bootstrap_program
from patcher.errors import UserError


class ExecTarget(str):
    """An ``--exec`` command where a host name would stand: the fan-out and its summary
    treat it as one more "host" (its text is the row's name)."""


def split_command(command: str) -> list[str]:
    """``command`` as an argument vector (``shlex.split``). Raises ``UserError`` when it is
    empty or not splittable (an unclosed quote)."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise UserError(f"--exec {command!r}: cannot split it into arguments ({e})") from None
    if not argv:
        raise UserError("--exec is empty: give a command that starts a Python, e.g. 'docker exec -i NAME python3'")
    return argv


class ExecTransport(BootstrapTransport):
    """The agent under the Python that ``command`` starts (one process per subcommand).

    Args:
        command: the ``--exec`` text, e.g. ``"kubectl exec -i trainer-0 -- python3"``.
        target: ``--target`` as the far side sees it, or None for that Python's environment.
    Raises ``UserError`` (on entering) when the command cannot be started.
    """

    OWN_GROUP = True  # a wrapper (``sh -c``, sudo) may leave children: they end with the run

    def __init__(self, command: str, target: str | None) -> None:
        self.command = command
        self.argv = split_command(command)
        self.label = f"{command}:{target}" if target else command
        super().__init__(target)
        self._header_where, self._where = command, f"--exec {command!r}"

    def _argv(self) -> list[str]:
        return [*self.argv, "-c", bootstrap_program()]

    def __enter__(self) -> "ExecTransport":
        try:
            return super().__enter__()
        except FileNotFoundError:
            raise UserError(f"--exec {self.command!r}: {self.argv[0]}: command not found") from None
        except PermissionError:
            raise UserError(f"--exec {self.command!r}: {self.argv[0]}: permission denied (not executable?)") from None
        except OSError as e:
            raise UserError(f"--exec {self.command!r}: cannot run {self.argv[0]}: {e.strerror}") from None

    def _failure(self, op: str) -> str:
        code = self._exit_code()
        last = last_line(self.stderr_text())
        if code in (126, 127):  # the shell's own word comes first: "pyenv: python2: command not found"
            said = [ln.strip() for ln in self.stderr_text().splitlines() if ln.strip()]
            last = said[0] if said else ("command not found" if code == 127 else "not executable")
        during = "while committing" if op == "commit" else "while reading"
        if code < 0:
            return (
                f"{self._where}: the agent was killed (signal {-code}) {during}; the next speculators-patch "
                f"command on that target finishes a commit it had started past its commit point, or rolls it back"
            )
        hint = (
            ""
            if self._synced
            else (
                "; the command must start a Python 3.8+ that runs the program given "
                "after it as -c PROGRAM (e.g. 'docker exec -i NAME python3')"
            )
        )
        return f"{self._where}: the command ended (status {code}) {during}: {last or 'no output'}{hint}"

"""The agent under a local interpreter, and how ``--target`` names it (docs/ARCHITECTURE.md:
"Which interpreter a target is")."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from patcher.connect.program import AGENT_PROGRAM
from patcher.connect.transport import Transport
from patcher.errors import UserError


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
        self.tool_env = False  # True: the interpreter running this tool, chosen for want of a target

    def _argv(self) -> list[str]:
        flags = ["-I", "-S"] if self.site_packages else []
        return [self.python, *flags, "-c", AGENT_PROGRAM, self._marker.decode()]

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
        own = LocalTransport(sys.executable)
        own.tool_env = True  # nothing named a target: an error about it should say so
        return own, None
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

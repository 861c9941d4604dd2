"""Helpers shared by the test tiers: paths, digests and the real CLI.

Import these with ``from support import ...`` (several directories have a conftest.py, so
``from conftest import`` would pick whichever was imported first). pyproject.toml puts this
folder, fixtures/ and the tiers' helper folders on the path (``pythonpath``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"
WORKER = "speculators/data_generation/custom_worker.py"
EAGLE = "speculators/models/eagle.py"  # SP014 (transformers 5.24+), SP036 (transformers 5)
PYDANTIC_UTILS = "speculators/utils/pydantic_utils.py"  # SP019
PREPROCESSING = "speculators/data_generation/preprocessing.py"  # SP033
TRAINER = "speculators/train/trainer.py"  # SP035
# What a full apply rewrites in speculators 0.3.0 on the sandbox's stack (vLLM 0.16, transformers
# 4.57.6: SP030-SP032, for transformers 5.4+, SP036 for 5.x and SP014 for 5.24+ are not needed
# there, so eagle.py stays as pip installed it).
PATCHED_FILES = sorted([GENERATOR, WORKER, PYDANTIC_UTILS, PREPROCESSING, TRAINER])
CLI = [sys.executable, "-m", "patcher"]
# The full sweep (make test-full): every kind of the tests that sample by default (the fault
# tier's kill and error points, the break test's kinds, the fast path's output variants).
FULL_SWEEP = os.environ.get("SPECULATORS_PATCH_FULL_SWEEP") == "1"
# The patches that keep hidden states attributed to the right request (SP010, SP012, SP022), and
# those that build on them (SP027 on SP022, SP028 on SP010, SP029 on SP012): left out together.
CAPTURE_FIXES = ("SP010", "SP012", "SP022", "SP027", "SP028", "SP029")
# "The API fixes only": every fix of 0.3.0's own capture logic left out (SP009 too).
API_FIXES_ONLY = ("SP009", *CAPTURE_FIXES)


def skipping(ids) -> list[str]:
    """``--skip ID`` for each of ``ids``."""
    return [arg for pid in ids for arg in ("--skip", pid)]


# Figures a tier prints at the end of the run (the fault tier's tallies: kill points tried,
# kinds clean), filled through the ``figures`` fixture; tests/conftest.py prints them and,
# under pytest-xdist, gathers each worker's.
FIGURES: dict[str, str] = {}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> digest)."""
    return {str(p.relative_to(root)): digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


def run_cli(*args: str, env: dict | None = None, text: bool = True) -> subprocess.CompletedProcess:
    """Run the real ``speculators-patch`` CLI in a fresh process (``text=False``: its output as bytes)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([*CLI, *args], capture_output=True, text=text, env=full_env, cwd=ROOT, timeout=300)


def run_json(*args: str, **kw) -> tuple[int, dict]:
    result = run_cli(*args, "--json", **kw)
    return result.returncode, json.loads(result.stdout)


# --- Odd targets and a held lock (issue 37) ---------------------------------------------

# Holds an exclusive record lock on argv[1] (as another speculators-patch would) until its
# stdin closes; says "held" once it has it.
HOLDER = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR)\n"
    "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


def commit_point_steps(tmp_path: Path) -> tuple[int, int]:
    """The agent's step numbers of an ``apply``'s first write and of its first deletion after
    the commit point (``rename ... cleanup.json``), from a fault log of a run on a fresh
    sandbox under ``tmp_path`` (``SPECULATORS_PATCH_FAULT=kind@step`` aims at them)."""
    from sandbox import make_sandbox

    probe = make_sandbox(tmp_path / "probe")
    log = tmp_path / "steps.log"
    env = {"SPECULATORS_PATCH_FAULT": "none@0", "SPECULATORS_PATCH_FAULT_LOG": str(log)}
    assert run_cli("apply", "--target", str(probe), env=env).returncode == 0
    lines = [ln.split(" ", 2) for ln in log.read_text().splitlines()]
    at = next(i for i, (_, what, path) in enumerate(lines) if what == "rename" and path.endswith("cleanup.json"))
    return int(lines[0][0]), next(int(n) for n, what, _ in lines[at + 1 :] if what == "unlink")


def hold_lock(lock: Path) -> subprocess.Popen:
    """A process holding ``lock`` as another run would (``HOLDER``), once it has it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def release_lock(holder: subprocess.Popen) -> None:
    """Let ``hold_lock``'s process go, and wait for it."""
    holder.stdin.close()
    holder.wait(timeout=30)


def processes(*words: str) -> list[str]:
    """The command lines of this machine's processes that hold every one of ``words``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(w in line for w in words):
            found.append(f"{entry.name}: {line[:120]}")
    return found


# What the stand-in runs: the agent is started as ``python [-I -S] -c PROGRAM ARGS...``.
FAKE = """#!{real}
import os, sys, sysconfig  # the paths are computed before the version is changed
sys.version_info = ({major}, {minor}, 99, "final", 0)
REFUSE = {refuse!r}
if REFUSE:
    import ast

    _parse = ast.parse

    def parse(source, *args, **kwargs):
        text = source if isinstance(source, bytes) else str(source).encode()
        if REFUSE in text:
            raise SyntaxError("invalid syntax (this parser is {major}.{minor}'s)")
        return _parse(source, *args, **kwargs)

    ast.parse = parse
args = sys.argv[1:]
while args and args[0] in ("-I", "-S"):
    args = args[1:]
if args[:1] != ["-c"]:
    os.execv({real!r}, [{real!r}] + sys.argv[1:])
sys.argv = ["-c"] + args[2:]
exec(compile(args[1], "<string>", "exec"), {{"__name__": "__main__"}})
"""


def pretend_python(env: Path, version: str, refuse: bytes = b"") -> Path:
    """Make ``env/bin/python`` a stand-in that says it is Python ``version``, run by the venv's
    own ``bin/python3.X`` (whose path is then its ``sys.executable``); returns the stand-in."""
    python = env / "bin" / "python"
    real = str(env / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}")
    major, minor = version.split(".")
    python.unlink()
    python.write_text(FAKE.format(real=real, major=int(major), minor=int(minor), refuse=refuse))
    python.chmod(0o755)
    return python

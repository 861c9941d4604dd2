"""Hidden-state extraction throughput: speculators 0.3.0 patched by this tool vs upstream 0.4.0.

Both run their own ``VllmHiddenStatesGenerator(...).generate(token_ids)`` on the same real
vLLM 0.16.0 CPU engine (the cached engine environment), the same tiny Llama checkpoint
(``fixtures/models.py``), the same layers and the same batch; each in its own target venv
(``tests/e2e/targets.py``): 0.3.0 patched by ``speculators-patch apply``, 0.4.0 as pip
installed it. One run measures both and prints tokens/s and the ratio:

    python benchmarks/extraction_throughput.py [--pairs 15]

Method: both generators are started side by side (one process each, vLLM workers asleep
when idle: ``VLLM_SLEEP_WHEN_IDLE=1``), warmed up with one generate(), then called in turn,
A B A B ..., ``--pairs`` times on the batch. Each pair gives a throughput ratio measured
under the same machine load; the reported ratio is the median of those paired ratios (this
2-core machine is shared, so single timings vary by 2-5x; pairing cancels much of it). Each
call is timed by wall clock and by CPU time of the generator's process and vLLM's worker
processes (psutil), the latter being less sensitive to other load.

Upstream 0.4.0 on CPU: its ``mem_get_info()`` asks torch's current accelerator, which is
None on CPU, and returns (0, 0): the KV cache gets 0 bytes and the generator cannot start.
The benchmark therefore gives 0.4.0 the figure the patched 0.3.0 gets from vLLM
(``VLLM_CPU_KVCACHE_SPACE`` bytes) in place of that query; both KV caches then have the same
number of blocks, which the output shows. Nothing else of 0.4.0 is touched.
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

ROOT = Path(__file__).resolve().parents[1]
MAX_MODEL_LEN = 512
LAYERS = [0, 2, 5]
MARK = "@@bench "  # prefixes the worker's replies on stdout
# 32 prompts of 200-510 tokens (about 11,400 tokens): over the 8,192-token step budget, so
# both generators run chunked steps, as a real data-generation batch does.
LENGTHS = [200 + (i * 97) % 311 for i in range(32)]


def worker(model_dir: str) -> None:
    """Runs in a target venv (torch, vLLM, one speculators); one generate() per line on stdin."""
    import random

    import speculators.data_generation.vllm_hidden_states_generator as gen_module

    if hasattr(gen_module, "mem_get_info"):  # 0.4.0: see the module docstring
        kv_bytes = int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * (1 << 30))
        gen_module.mem_get_info = lambda: (kv_bytes, kv_bytes)

    rng = random.Random(7)
    batch = [[rng.randrange(4, 512) for _ in range(n)] for n in LENGTHS]
    generator = gen_module.VllmHiddenStatesGenerator(model_dir, layer_ids=LAYERS, max_model_len=MAX_MODEL_LEN)
    result = generator.generate(batch)  # warm-up
    assert len(result) == len(batch) and all(r["hidden_states"][0].shape[0] == len(r["input_ids"]) for r in result)
    from importlib.metadata import version

    ready = {
        "speculators": version("speculators"),
        "kv_cache_blocks": generator.vllm_config.cache_config.num_gpu_blocks,
    }
    print(MARK, json.dumps(ready), flush=True)
    import psutil

    def cpu_seconds() -> float:  # this process and vLLM's worker processes
        procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    for _ in sys.stdin:
        t, c = time.perf_counter(), cpu_seconds()
        generator.generate(batch)
        print(MARK, json.dumps([time.perf_counter() - t, cpu_seconds() - c]), flush=True)
    generator.executor.shutdown()


def _reply(proc: subprocess.Popen) -> str | None:
    """The worker's next marked line (vLLM also logs to stdout); None if it exited."""
    for line in proc.stdout:
        if line.startswith(MARK):
            return line[len(MARK) :].strip()
    return None


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=15)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    from targets import cli, ensure_engine_env, ensure_models, make_target, speculators_wheel

    ensure_engine_env()
    model = ensure_models() / "llama"
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_SLEEP_WHEN_IDLE": "1",
    }
    with tempfile.TemporaryDirectory(prefix="extraction-bench-") as tmp:
        tmp = Path(tmp)
        patched = make_target(tmp / "patched-0.3.0", speculators_wheel("0.3.0"))
        applied = cli("apply", "--target", str(patched))
        if applied.returncode != 0:
            print(applied.stdout, applied.stderr, file=sys.stderr)
            return 1
        upstream = make_target(tmp / "upstream-0.4.0", speculators_wheel("0.4.0"))
        sides = {"patched 0.3.0": patched, "upstream 0.4.0": upstream}
        procs, info = {}, {}
        for name, target in sides.items():  # one after the other: start-up is not measured
            procs[name] = subprocess.Popen(
                [str(target / "bin" / "python"), __file__, "--worker", str(model)],
                cwd=tmp,
                env=env,
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=(tmp / f"{name}.log").open("w"),
            )
            line = _reply(procs[name])
            if line is None:
                print(f"{name} failed to start:\n{(tmp / f'{name}.log').read_text()[-3000:]}", file=sys.stderr)
                return 1
            info[name] = json.loads(line)
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        cpu: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.pairs):
            for name, proc in procs.items():
                proc.stdin.write("run\n")
                proc.stdin.flush()
                wall, used = json.loads(_reply(proc))
                seconds[name].append(wall)
                cpu[name].append(used)
        for proc in procs.values():
            proc.stdin.close()
            proc.wait(timeout=120)

    tokens = sum(LENGTHS)
    print(
        f"model: tiny Llama (6 layers, hidden 128), layers {LAYERS}, batch {len(LENGTHS)} prompts / "
        f"{tokens} tokens, max_model_len {MAX_MODEL_LEN}, vLLM 0.16.0 CPU, bf16"
    )
    print(f"{args.pairs} pairs of generate() calls, alternating, after one warm-up each")
    for name, secs in seconds.items():
        rates = [tokens / x for x in secs]
        print(
            f"{name:>15} (speculators {info[name]['speculators']}): median {statistics.median(rates):,.0f} "
            f"tokens/s, best {max(rates):,.0f}, worst {min(rates):,.0f}; KV cache blocks "
            f"{info[name]['kv_cache_blocks']}"
        )
    for name in sides:
        print(
            f"{name:>15}: median CPU time per call {statistics.median(cpu[name]):.2f} s "
            f"(driver + vLLM workers; {tokens / statistics.median(cpu[name]):,.0f} tokens per CPU-second)"
        )
    for label, data in (("wall time", seconds), ("CPU time", cpu)):
        a, b = data["patched 0.3.0"], data["upstream 0.4.0"]
        ratios = sorted(y / x for x, y in zip(a, b, strict=False))  # throughput A / throughput B per pair
        print(
            f"ratio patched 0.3.0 / upstream 0.4.0 by {label} (median of {len(ratios)} paired ratios): "
            f"{statistics.median(ratios):.3f} (quartiles {ratios[len(ratios) // 4]:.3f}-"
            f"{ratios[3 * len(ratios) // 4]:.3f}; best calls {min(b) / min(a):.3f})"
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        sys.exit(0)
    sys.exit(main())

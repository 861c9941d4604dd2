"""GPU extraction throughput: the patched speculators generator vs vLLM's own prefill, one GPU.

Runs under the target's interpreter (torch with CUDA, vLLM, speculators patched by
``speculators-patch apply``), from a checkout of this project:

    /path/to/env/bin/python benchmarks/gpu_extraction.py [--prompts 480] [--rounds 3] [--batch 64]

The model has Llama-3.1-8B's shapes (hidden 4096, 32 layers, 32 heads / 8 KV heads, MLP 14336,
vocab 128256), written as a config and a tokenizer by selftest's model builder
(``patcher/agent/selftest/tiny_models.py``); both engines load random weights with vLLM's
``load_format="dummy"`` (speed does not depend on the values, and writing then reading 16 GB
of random checkpoint costs minutes of device time). The dataset is seeded: ``--prompts``
prompts of 256-2,048 tokens. Three layers are captured, as EAGLE-3 takes them (2, 16, 29).

Both engines run in this one process, side by side on the GPU (each gets
``gpu_memory_utilization`` 0.45), with the same limits: eager mode (speculators' generator sets
``enforce_eager=True``; vLLM gets the same, so compilation choices do not enter the ratio),
``max_num_batched_tokens`` 8,192 and ``max_num_seqs`` 32 (the generator's), chunked prefill on,
prefix caching off. vLLM's side is ``LLM.generate`` with ``max_tokens=1`` on the same batches
the generator gets (``--batch`` prompts per ``generate()`` call, as a data-generation loop
calls it). After a warm-up batch each round times every batch on both, alternating which runs
first; the ratio is the median of the per-round ratios (tokens/s generator / tokens/s vLLM).

Printed: tokens/s of each, the ratio, the model FLOP utilisation of each (2 x 6.98e9 FLOP per
prompt token: the decoder layers' parameters; embedding and LM head excluded, prefill samples
one token per prompt; against 790 TFLOP/s of bf16, the H200's measured matrix rate), peak GPU
memory in use on the device and host memory (this process and its children), the generator's
host memory against what it captures (the largest ``generate()`` call's captured bytes; this
process's resident memory at its peak during a call, over what it held just before the call;
its growth over the whole run; the shared ring of SP028, which the worker maps too), and where
the generator's time goes: scheduling (this process's Python), steps (``execute_model`` +
``sample_tokens``: the GPU forward and the worker's per-step Python), transfer (copying the
finished steps' captures out of shared host memory between steps, SP029), collect (the last
step's captures at the end of ``generate()``; without SP028/SP029, ``_get_captured_states``:
concatenation and transfer out of the worker) and the rest of ``generate()`` (requests, and
without SP029 the results' copies to the host). ``--runner v1|v2`` sets
``VLLM_USE_V2_MODEL_RUNNER`` for both engines (``auto``: vLLM's choice). A JSON line after
``@@gpu-bench`` has every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
LAYERS = [2, 16, 29]  # EAGLE-3: low, middle, high
# --tiny: the same run on a tiny Llama, on whatever device vLLM has (a CPU engine too): a check
# of this script, not a figure.
TINY = {
    **LLAMA_8B,
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}
MAX_MODEL_LEN = 4096
STEP_TOKENS, MAX_SEQS = 8192, 32  # speculators 0.3.0's scheduler limits
GPU_SHARE = 0.45
PEAK_BF16 = 790e12  # FLOP/s, bf16 matrix work measured on the H200
MARK = "@@gpu-bench "


def layer_params(config: dict) -> float:
    """Parameters of the decoder layers (attention + gated MLP), the FLOP-per-token basis."""
    h, kv = (
        config["hidden_size"],
        config["hidden_size"] // config["num_attention_heads"] * config["num_key_value_heads"],
    )
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * config["intermediate_size"]
    return float(per_layer * config["num_hidden_layers"])


def build_model(dest: Path, config: dict) -> Path:
    sys.path.insert(0, str(ROOT))
    from patcher.agent.selftest import tiny_models

    dest.mkdir(parents=True)
    tiny_models.save_tokenizer(dest, config["vocab_size"])
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def dataset(n: int, vocab: int, seed: int = 2026) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(256, 2048))] for _ in range(n)]


class Peak(threading.Thread):
    """Samples device memory in use (all processes, ``mem_get_info``) and host RSS of this
    process and its children every 0.2 s; ``device`` and ``host`` hold the peaks (bytes)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.device = self.host = 0
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil
        import torch

        me = psutil.Process()
        while not self.stop.wait(0.2):
            free, total = torch.cuda.mem_get_info()
            self.device = max(self.device, total - free)
            rss = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            self.host = max(self.host, rss)


class HostMemory(threading.Thread):
    """This process's resident memory (bytes) sampled every 10 ms while ``during`` is set:
    ``peak_over_start`` is the largest rise within one call over the value just before it."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import psutil

        self.process = psutil.Process()
        self.during, self.stop = threading.Event(), threading.Event()
        self.start_rss = self.peak = self.peak_over_start = 0

    def begin(self) -> None:
        self.start_rss = self.peak = self.process.memory_info().rss
        self.during.set()

    def end(self) -> None:
        self.during.clear()
        self.peak = max(self.peak, self.process.memory_info().rss)
        self.peak_over_start = max(self.peak_over_start, self.peak - self.start_rss)

    def run(self) -> None:
        while not self.stop.wait(0.01):
            rss = self.process.memory_info().rss
            self.overall = max(getattr(self, "overall", 0), rss)
            if self.during.is_set():
                self.peak = max(self.peak, rss)


class Timers:
    """Wall time spent inside wrapped callables, by name (seconds)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, owner, attr: str, name: str, only=None) -> None:
        """Time ``owner.attr`` under ``name``; ``only(args, kwargs)`` selects the calls counted."""
        inner = getattr(owner, attr)

        def timed(*args, **kwargs):
            if only is not None and not only(args, kwargs):
                return inner(*args, **kwargs)
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

        setattr(owner, attr, timed)


def start_generator(model: Path, layers: list[int]):
    import speculators.data_generation.vllm_hidden_states_generator as gen_module
    import vllm.config

    # Random weights without a checkpoint (see the module docstring); nothing else changes.
    gen_module.LoadConfig = lambda **kw: vllm.config.LoadConfig(**{"load_format": "dummy", **kw})
    return gen_module.VllmHiddenStatesGenerator(
        str(model), layer_ids=layers, max_model_len=MAX_MODEL_LEN, gpu_memory_utilization=GPU_SHARE
    )


def start_vllm(model: Path):
    from vllm import LLM

    return LLM(
        model=str(model),
        load_format="dummy",
        enforce_eager=True,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=STEP_TOKENS,
        max_num_seqs=MAX_SEQS,
        gpu_memory_utilization=GPU_SHARE,
        enable_prefix_caching=False,
        skip_tokenizer_init=True,
    )


def run_vllm(llm, batch) -> None:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    llm.generate([{"prompt_token_ids": ids} for ids in batch], params, use_tqdm=False)


def run_generator(generator, batch, hidden: int, memory: HostMemory | None = None) -> int:
    """One ``generate()`` call; returns the bytes of hidden states it returned."""
    if memory is not None:
        memory.begin()
    results = generator.generate(batch)
    if memory is not None:
        memory.end()
    assert len(results) == len(batch) and all(
        tuple(r["hidden_states"][0].shape) == (len(ids), hidden) and r["hidden_states"][0].device.type == "cpu"
        for r, ids in zip(results, batch, strict=False)
    )
    return sum(h.numel() * h.element_size() for r in results for h in r["hidden_states"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=480)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64, help="prompts per generate() call")
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama on any device: checks the script only")
    parser.add_argument(
        "--runner",
        choices=("auto", "v1", "v2"),
        default="auto",
        help="the GPU model runner of both engines (VLLM_USE_V2_MODEL_RUNNER; auto: vLLM's choice)",
    )
    args = parser.parse_args()
    if args.runner != "auto":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if args.runner == "v2" else "0"
    config, layers = (TINY, [0, 3, 5]) if args.tiny else (LLAMA_8B, LAYERS)
    for key, value in {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }.items():
        os.environ.setdefault(key, value)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    data = dataset(args.prompts + args.batch, config["vocab_size"])
    warmup, prompts = data[: args.batch], data[args.batch :]
    per_round = len(prompts) // args.rounds
    rounds = [prompts[r * per_round : (r + 1) * per_round] for r in range(args.rounds)]
    peak = Peak()
    if cuda:
        peak.start()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "llama-8b-shape", config)
        t = time.perf_counter()
        generator = start_generator(model, layers)
        start_gen = time.perf_counter() - t
        t = time.perf_counter()
        llm = start_vllm(model)
        start_llm = time.perf_counter() - t
        hidden = config["hidden_size"]
        memory = HostMemory()
        rss_started = memory.process.memory_info().rss  # both engines up, no generate() call yet
        memory.start()
        run_generator(generator, warmup, hidden)
        run_vllm(llm, warmup)
        timers = Timers()
        timers.wrap(generator.scheduler, "schedule", "schedule")
        for attr in ("execute_model", "sample_tokens"):
            timers.wrap(generator.executor, attr, "steps")
        host = getattr(generator, "_host_captures", None)  # SP029
        ring = getattr(host, "ring", None)
        if ring is not None:
            timers.wrap(host, "collect", "transfer", only=lambda args, kwargs: not (args or kwargs))  # between steps
            timers.wrap(host, "finish", "collect")
            timers.wrap(
                generator.executor,
                "collective_rpc",
                "collect",
                only=lambda args, kwargs: bool(args) and args[0] == "_reset_capture",
            )
        else:
            # The executor's own steps go through collective_rpc too: only the capture RPCs count here.
            timers.wrap(
                generator.executor,
                "collective_rpc",
                "collect",
                only=lambda args, kwargs: bool(args) and args[0] in ("_get_captured_states", "_reset_capture"),
            )
        rss_before = memory.process.memory_info().rss
        captured_max, gen_s, llm_s, ratios, tokens = 0, 0.0, 0.0, [], 0
        for r, prompts_r in enumerate(rounds):
            batches = [prompts_r[i : i + args.batch] for i in range(0, len(prompts_r), args.batch)]
            n = sum(map(len, prompts_r))
            times = {}
            for which in ("gen", "llm") if r % 2 == 0 else ("llm", "gen"):
                t = time.perf_counter()
                for batch in batches:
                    if which == "gen":
                        captured_max = max(captured_max, run_generator(generator, batch, hidden, memory))
                    else:
                        run_vllm(llm, batch)
                if cuda:
                    torch.cuda.synchronize()
                times[which] = time.perf_counter() - t
            gen_s, llm_s, tokens = gen_s + times["gen"], llm_s + times["llm"], tokens + n
            ratios.append(times["llm"] / times["gen"])
            print(
                f"round {r + 1}: {len(prompts_r)} prompts, {n} tokens: generator {n / times['gen']:,.0f} tok/s, "
                f"vLLM {n / times['llm']:,.0f} tok/s, ratio {ratios[-1]:.3f}",
                flush=True,
            )
        peak.stop.set()
        memory.stop.set()
        growth = memory.process.memory_info().rss - rss_before
        flop = 2 * layer_params(config)
        gen_tps, llm_tps = tokens / gen_s, tokens / llm_s
        where = dict(timers.seconds)
        where["rest of generate()"] = gen_s - sum(where.values())
        figures = {
            "gpu": torch.cuda.get_device_name(0) if cuda else "none (CPU engine)",
            "prompts": sum(map(len, rounds)),
            "tokens": tokens,
            "batch": args.batch,
            "rounds": args.rounds,
            "layers": layers,
            "model": "tiny" if args.tiny else "Llama-3.1-8B shape",
            "generator_tokens_per_s": round(gen_tps),
            "vllm_tokens_per_s": round(llm_tps),
            "ratio_median": round(statistics.median(ratios), 4),
            "ratios": [round(x, 4) for x in ratios],
            "mfu_generator": round(gen_tps * flop / PEAK_BF16, 4),
            "mfu_vllm": round(llm_tps * flop / PEAK_BF16, 4),
            "peak_device_gib": round(peak.device / 2**30, 1),
            "peak_host_gib": round(peak.host / 2**30, 1),
            "start_s": {"generator": round(start_gen, 1), "vllm": round(start_llm, 1)},
            "generator_seconds": {k: round(v, 2) for k, v in where.items()},
            "generator_total_s": round(gen_s, 2),
            "runner": args.runner,
            "transfer": "shared host memory (SP028/SP029)" if ring is not None else "RPC",
            "ring_mib": round(ring.numel() * ring.element_size() / 2**20) if ring is not None else 0,
            "ring_pinned": bool(ring is not None and host.shared["pinned"]),  # as the worker registered it
            "captured_per_call_gib": round(captured_max / 2**30, 2),
            "host_rise_per_call_gib": round(memory.peak_over_start / 2**30, 2),
            "host_rise_over_captured": round(memory.peak_over_start / captured_max, 2) if captured_max else None,
            "host_growth_gib": round(growth / 2**30, 2),
            "host_peak_over_started_gib": round((memory.overall - rss_started) / 2**30, 2),
            "host_peak_over_captured": round((memory.overall - rss_started) / captured_max, 2)
            if captured_max
            else None,
        }
        print(f"GPU {figures['gpu']}: {figures['prompts']} prompts, {tokens:,} tokens, batches of {args.batch}")
        print(
            f"patched generator: {gen_tps:,.0f} tok/s (MFU {figures['mfu_generator']:.1%}); "
            f"vLLM LLM.generate(max_tokens=1): {llm_tps:,.0f} tok/s (MFU {figures['mfu_vllm']:.1%}); "
            f"ratio {figures['ratio_median']:.3f} (median of {args.rounds} rounds)"
        )
        print(
            f"peak GPU memory in use (both engines) {figures['peak_device_gib']} GiB; host {figures['peak_host_gib']} GiB"
        )
        print(
            f"generator host memory: captured {figures['captured_per_call_gib']} GiB in the largest generate() call; "
            f"this process rose by at most {figures['host_rise_per_call_gib']} GiB during a call "
            f"({figures['host_rise_over_captured']}x the captured bytes), {figures['host_growth_gib']} GiB over the run; "
            f"its peak was {figures['host_peak_over_started_gib']} GiB above its size before the first call "
            f"({figures['host_peak_over_captured']}x the captured bytes); "
            f"transfer: {figures['transfer']}"
            + (
                f", ring {figures['ring_mib']} MiB {'pinned' if figures['ring_pinned'] else 'not pinned'}"
                if ring is not None
                else ""
            )
        )
        print("generator time: " + ", ".join(f"{k} {v:.1f} s ({v / gen_s:.0%})" for k, v in where.items()))
        print(MARK + json.dumps(figures), flush=True)
        generator.executor.shutdown()


if __name__ == "__main__":
    main()

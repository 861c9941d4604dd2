"""GPU extraction throughput: the patched speculators generator vs vLLM's own engines, one GPU.

Runs under the target's interpreter (torch with CUDA, vLLM, speculators patched by
``speculators-patch apply``), from a checkout of this project:

    /path/to/env/bin/python benchmarks/gpu_extraction.py --mode separate --model llama8b|moe [--prompts 120] [--batch 60]
    /path/to/env/bin/python benchmarks/gpu_extraction.py [--mode paired] [--prompts 480] [--rounds 3] [--batch 64]

Models (``--model``), written as a ``config.json`` and a WordLevel tokenizer (selftest's
``patcher/agent/selftest/tiny_models.save_tokenizer``); every engine loads random weights with
vLLM's ``load_format="dummy"`` (speed does not depend on the values, and writing then reading
16-31 GB of random checkpoint costs minutes of device time):
- ``llama8b``: Llama-3.1-8B's shapes (``LlamaForCausalLM``: hidden 4096, 32 layers, 32 heads /
  8 KV heads of 128, MLP 14336, vocab 128256); 6.98e9 decoder parameters, all active.
  Captured layers 2, 16, 29 (EAGLE-3's low, middle, high).
- ``moe``: Qwen3-30B-A3B's widths (``Qwen3MoeForCausalLM``, the keys vLLM's
  ``vllm/model_executor/models/qwen3_moe.py`` reads, 0.32-0.34: hidden 2048, 32 heads / 4 KV
  heads of ``head_dim`` 128, ``num_experts`` 128 of ``moe_intermediate_size`` 768,
  ``num_experts_per_tok`` 8 with ``norm_topk_prob``, every layer sparse, vocab 151936) with 24
  of its 48 layers, so that it fits one 80 GB GPU at GPU share 0.8: 15.6e9 parameters (31 GB in
  bf16), 1.37e9 of them active per token (decoder layers). Captured layers 2, 12, 21. Its
  decoder layers sit in ``Qwen3MoeModel.layers`` and return ``(hidden_states, residual)``, as
  SP009's capture hooks need.
- ``--tiny``: the same architecture at hidden 128 (6 layers; the MoE with 8 experts, 2 per
  token), on whatever device vLLM has (the CPU engine too): a check of this script, not a figure.

The dataset is seeded: ``--prompts`` prompts of 256-2,048 token ids, plus one warm-up batch.
Every engine gets the same limits: ``max_num_batched_tokens`` 8,192 and ``max_num_seqs`` 32
(speculators 0.3.0's generator's), ``max_model_len`` 4,096, chunked prefill on, prefix caching
off, and the prompts in the same batches (``--batch`` prompts per ``generate()`` call, as a
data-generation loop calls it).

``--mode separate`` (issue 47's references): one engine per process, one after another, each
alone on the GPU (``gpu_memory_utilization`` 0.8). Rows (``--rows``, in this order):
- ``eager``: vLLM's ``LLM(enforce_eager=True)``, ``generate`` with ``max_tokens=1``: its prefill.
- ``default``: vLLM's ``LLM()`` with its default compilation config (torch.compile and CUDA
  graphs on a GPU; on the CPU engine torch.compile only), ``max_tokens=1``.
- ``extract``: vLLM's own hidden-state extraction, used as vLLM's example
  (``examples/offline_inference/extract_hidden_states.py``) uses it, default compilation config:
  ``speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
  "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [...]}}}`` (the
  drafter ``vllm/v1/worker/gpu/spec_decode/extract_hidden_states.py:ExtractHiddenStatesSpeculator``
  on Model Runner V2, ``vllm/v1/spec_decode/extract_hidden_states.py`` on V1; vLLM 0.18+) and
  ``kv_transfer_config`` with ``ExampleHiddenStatesConnector``
  (``vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``, 0.32 and
  0.34: copies each finished request's states device-to-host on a side stream into pinned
  memory, and a thread writes one safetensors file per request) writing to ``/dev/shm`` (a
  temporary directory when ``/dev/shm`` lacks the room). After each ``generate()`` every
  request's file is read back into host memory with the module's ``load_hidden_states`` (which
  waits on the file's lock), checked (``[prompt tokens, 3 layers, hidden]``, the prompt's token
  ids) and deleted (``cleanup_hidden_states``); the batch's tensors are dropped after the check.
  vLLM's aux layer k is the state entering layer k (``EagleModelMixin._maybe_add_hidden_state``
  at ``layer_idx + 1``, vllm/model_executor/models/interfaces.py, 0.34), so it is given the
  captured layers + 1: the same tensors the generator returns. On the CPU engine the
  connector's pinned host buffer cannot exist (``pin_memory=True`` needs an accelerator), so
  the row runs with ``CpuHiddenStatesConnector`` below: vLLM's connector, unpinned. Without
  vLLM's connector module (vLLM < 0.18) the row is skipped, with the reason printed.
- ``generator``: speculators 0.3.0's ``VllmHiddenStatesGenerator``, patched (eager, as it sets
  ``enforce_eager=True``), ``generate()`` per batch, every capture checked on the host.
Each child process starts its engine (``start_s``: from the constructor's call to its return),
runs one warm-up batch, then every batch once, timed together (with ``torch.cuda.synchronize``
at the end), and prints one JSON line after ``@@gpu-bench-row`` (tokens/s, start seconds, the
seconds of each prompt round, peak GPU memory, and for the generator where its time went, as
below). The parent prints the table and the ratios generator / default, generator / extract,
generator / eager (tokens/s over tokens/s, all from the same run), then a JSON line after
``@@gpu-bench`` with every figure. A row whose child fails is shown as failed with the tail of
its log (``--logs DIR`` keeps every child's log).

``--mode paired`` (the default; the mode of the figures in docs/speed.md before issue 47):
vLLM's eager engine and the generator in this one process, side by side on the GPU (each gets
``gpu_memory_utilization`` 0.45), with the same limits, eager on both (compilation choices do
not enter the ratio). After a warm-up batch each round times every batch on both, alternating
which runs first; the ratio is the median of the per-round ratios (tokens/s generator /
tokens/s vLLM).

Printed in both modes: tokens/s, ratios, the model FLOP utilisation of each engine (2 FLOP per
active decoder parameter per prompt token, ``active_params``: attention projections, the dense
MLP or the router plus the ``num_experts_per_tok`` experts chosen; embedding, LM head and
attention scores excluded, prefill samples one token per prompt; against 790 TFLOP/s of bf16,
the H200's measured matrix rate), peak GPU memory in use on the device. Paired mode adds host
memory (this process and its children) and the generator's host memory against what it
captures (the largest ``generate()`` call's captured bytes; this process's resident memory at
its peak during a call, over what it held just before the call; its growth over the whole
run; the shared ring of SP028, which the worker maps too); both modes add where the
generator's time goes: scheduling (this process's Python), steps (``execute_model`` +
``sample_tokens``: the GPU forward and the worker's per-step Python), transfer (copying the
finished steps' captures out of shared host memory between steps, SP029), collect (the last
step's captures at the end of ``generate()``; without SP028/SP029, ``_get_captured_states``:
concatenation and transfer out of the worker) and the rest of ``generate()`` (requests, and
without SP029 the results' copies to the host). ``--runner v1|v2`` sets
``VLLM_USE_V2_MODEL_RUNNER`` for every engine (``auto``: vLLM's choice; vLLM 0.34 has only V2).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
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
# Qwen3-30B-A3B's config.json with 24 of its 48 layers (see the module docstring).
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,  # dense MLP width: unused, every layer is sparse
    "moe_intermediate_size": 768,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "hidden_act": "silu",
    "attention_bias": False,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
TINY_WIDTHS = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 6}
# --tiny: the same runs on tiny models, on whatever device vLLM has (a CPU engine too): a check
# of this script, not a figure. Heads of 64 (vLLM's CPU attention rejects head_dim 16).
TINY = {**LLAMA_8B, **TINY_WIDTHS, "num_attention_heads": 2, "num_key_value_heads": 2}
TINY_MOE = {
    **QWEN3_MOE,
    **TINY_WIDTHS,
    "moe_intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_experts": 8,
    "num_experts_per_tok": 2,
}
# --model -> (config, captured layers, label); the tiny ones under --tiny.
MODELS = {
    "llama8b": (LLAMA_8B, [2, 16, 29], "Llama-3.1-8B shape"),
    "moe": (QWEN3_MOE, [2, 12, 21], "Qwen3-30B-A3B widths, 24 layers"),
}
TINY_MODELS = {
    "llama8b": (TINY, [0, 2, 4], "tiny Llama"),
    "moe": (TINY_MOE, [0, 2, 4], "tiny Qwen3-MoE"),
}
MAX_MODEL_LEN = 4096
STEP_TOKENS, MAX_SEQS = 8192, 32  # speculators 0.3.0's scheduler limits
GPU_SHARE = {"paired": 0.45, "separate": 0.8}
PEAK_BF16 = 790e12  # FLOP/s, bf16 matrix work measured on the H200
MARK = "@@gpu-bench "
ROW_MARK = "@@gpu-bench-row "
ROWS = ("eager", "default", "extract", "generator")
ROW_NAMES = {
    "eager": "vLLM prefill, eager (enforce_eager=True, max_tokens=1)",
    "default": "vLLM prefill, default config (torch.compile + CUDA graphs)",
    "extract": "vLLM extract_hidden_states + ExampleHiddenStatesConnector, files read back",
    "generator": "patched speculators 0.3.0 generator (eager)",
}
# What the rows are on the CPU engine (--tiny there): no CUDA graphs, the connector unpinned.
CPU_ROW_NAMES = {
    "default": "vLLM prefill, default config (CPU: torch.compile, no CUDA graphs)",
    "extract": "vLLM extract_hidden_states + CpuHiddenStatesConnector (unpinned), files read back",
}
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
SHM = Path("/dev/shm")


def active_params(config: dict) -> float:
    """Decoder-layer parameters one token passes through (the FLOP-per-token basis): attention
    projections (q and o: hidden x heads x head_dim; k and v: hidden x KV heads x head_dim) and
    the MLP: gated dense (3 x hidden x intermediate), or for a sparse layer the router (hidden x
    experts) and ``num_experts_per_tok`` gated experts (3 x hidden x moe_intermediate each).
    Which layers are sparse follows vLLM's Qwen3MoeDecoderLayer (``mlp_only_layers``,
    ``decoder_sparse_step``; vllm/model_executor/models/qwen3_moe.py). Embedding, LM head, norms
    and attention scores are left out."""
    h = config["hidden_size"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    attention = 2 * h * q + 2 * h * kv
    dense = 3 * h * config["intermediate_size"]
    experts = config.get("num_experts", 0)
    sparse = h * experts + config.get("num_experts_per_tok", 0) * 3 * h * config.get("moe_intermediate_size", 0)
    step = config.get("decoder_sparse_step", 1)
    total = 0
    for layer in range(config["num_hidden_layers"]):
        is_sparse = experts > 0 and layer not in config.get("mlp_only_layers", []) and (layer + 1) % step == 0
        total += attention + (sparse if is_sparse else dense)
    return float(total)


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


def start_generator(model: Path, layers: list[int], share: float):
    import speculators.data_generation.vllm_hidden_states_generator as gen_module
    import vllm.config

    # Random weights without a checkpoint (see the module docstring); nothing else changes.
    gen_module.LoadConfig = lambda **kw: vllm.config.LoadConfig(**{"load_format": "dummy", **kw})
    return gen_module.VllmHiddenStatesGenerator(
        str(model), layer_ids=layers, max_model_len=MAX_MODEL_LEN, gpu_memory_utilization=share
    )


def start_vllm(model: Path, share: float, eager: bool = True, extract: dict | None = None):
    """vLLM's own ``LLM``: eager or its default compilation config; ``extract``: the
    ``speculative_config`` and ``kv_transfer_config`` of the extract_hidden_states route."""
    from vllm import LLM

    return LLM(
        model=str(model),
        load_format="dummy",
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=STEP_TOKENS,
        max_num_seqs=MAX_SEQS,
        gpu_memory_utilization=share,
        enable_prefix_caching=False,
        skip_tokenizer_init=True,
        **({"enforce_eager": True} if eager else {}),
        **(extract or {}),
    )


def extract_config(layers: list[int], storage: Path, cuda: bool) -> dict:
    """The ``LLM`` arguments of vLLM's extract_hidden_states route (vLLM's example's): aux layer
    k is the state entering layer k, so the captured layers + 1 (module docstring)."""
    connector = {"kv_connector": "ExampleHiddenStatesConnector"}
    if not cuda:  # the CPU engine: vLLM's connector without its pinned buffer (CpuHiddenStatesConnector)
        connector = {"kv_connector": "CpuHiddenStatesConnector", "kv_connector_module_path": Path(__file__).stem}
    return {
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [layer + 1 for layer in layers]}},
        },
        "kv_transfer_config": {
            **connector,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(storage)},
        },
    }


_CPU_CONNECTOR = None


def __getattr__(name: str):
    """``CpuHiddenStatesConnector``, made on first use (it subclasses a vLLM class that older
    releases lack); vLLM's connector factory loads it by module and class name."""
    global _CPU_CONNECTOR
    if name != "CpuHiddenStatesConnector":
        raise AttributeError(name)
    if _CPU_CONNECTOR is None:
        import importlib
        from contextlib import nullcontext

        import torch

        base = importlib.import_module(CONNECTOR).ExampleHiddenStatesConnector

        class Done:
            """A CUDA event or stream stand-in: the CPU copy is over when ``copy_`` returns."""

            def record(self, *args) -> None: ...
            def wait_event(self, *args) -> None: ...
            def synchronize(self) -> None: ...
            def query(self) -> bool:
                return True

        class CpuHiddenStatesConnector(base):
            """vLLM's ``ExampleHiddenStatesConnector`` for the CPU engine (``--tiny`` checks
            only). Its ``_submit_async_write`` copies on a CUDA side stream into
            ``torch.empty_like(..., pin_memory=True)`` and marks the copy with CUDA events; on
            a CPU build of torch pinned memory needs an accelerator and the events are
            placeholders without ``query``. Here, for that call, the buffer is ordinary memory
            and the stream and events are stand-ins that are always done (a CPU ``copy_`` is
            synchronous). Everything else (which rows, the files, the locks) is vLLM's."""

            def _get_copy_stream(self):
                return Done()

            def _submit_async_write(self, pending) -> None:
                saved = torch.empty_like, torch.cuda.Event, torch.cuda.stream

                def unpinned(*args, pin_memory=False, **kwargs):
                    return saved[0](*args, **kwargs)

                torch.empty_like, torch.cuda.Event, torch.cuda.stream = unpinned, Done, lambda stream: nullcontext()
                try:
                    super()._submit_async_write(pending)
                finally:
                    torch.empty_like, torch.cuda.Event, torch.cuda.stream = saved

        _CPU_CONNECTOR = CpuHiddenStatesConnector
    return _CPU_CONNECTOR


def extract_missing() -> str | None:
    """Why this vLLM cannot run the extract_hidden_states route, or None when it can."""
    for module in (CONNECTOR, "vllm.model_executor.models.extract_hidden_states"):
        try:
            if importlib.util.find_spec(module) is None:
                raise ImportError
        except ImportError:
            import vllm

            return f"vLLM {vllm.__version__} has no {module} (the route came in vLLM 0.18)"
    return None


def run_vllm(llm, batch) -> None:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    llm.generate([{"prompt_token_ids": ids} for ids in batch], params, use_tqdm=False)


def run_extract(llm, batch, hidden: int, n_layers: int) -> int:
    """One ``generate()`` call of the extract_hidden_states route, then every request's
    hidden states read back from its file into host memory, checked and the file deleted, as
    vLLM's example does; returns the bytes read back."""
    import importlib

    from vllm import SamplingParams

    connector = importlib.import_module(CONNECTOR)
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in batch], params, use_tqdm=False)
    states = []
    for output, ids in zip(outputs, batch, strict=True):
        path = output.kv_transfer_params["hidden_states_path"]
        data = connector.load_hidden_states(path)
        connector.cleanup_hidden_states(path)
        assert tuple(data["hidden_states"].shape) == (len(ids), n_layers, hidden), (
            data["hidden_states"].shape,
            len(ids),
        )
        assert data["token_ids"].tolist() == ids
        states.append(data["hidden_states"])
    return sum(s.numel() * s.element_size() for s in states)


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


def instrument(generator) -> tuple[Timers, object, object]:
    """Timers on the generator's scheduling, steps and capture transfer (module docstring);
    returns them with SP029's host-capture object and its SP028 ring (None without them)."""
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
        collect_parts(timers, generator, host)
    else:
        # The executor's own steps go through collective_rpc too: only the capture RPCs count here.
        timers.wrap(
            generator.executor,
            "collective_rpc",
            "collect",
            only=lambda args, kwargs: bool(args) and args[0] in ("_get_captured_states", "_reset_capture"),
        )
    return timers, host, ring


def collect_parts(timers: Timers, generator, host) -> None:
    """``timers.parts``: what "collect" is made of (seconds, within it, not added to the split):
    waiting for the copy thread's last job, the RPCs (``_staged_captures`` at the end,
    ``_reset_capture``), and the last step's rows copied on the calling thread."""
    parts = timers.parts = Timers()
    final = threading.Event()
    finish = host.finish

    def flagged(*args, **kwargs):
        final.set()
        try:
            return finish(*args, **kwargs)
        finally:
            final.clear()

    host.finish = flagged
    on_main = threading.main_thread
    parts.wrap(host, "_wait", "waiting for the copy thread", only=lambda a, k: final.is_set())
    parts.wrap(
        host,
        "_copy_out",
        "last step's rows",
        only=lambda a, k: final.is_set() and threading.current_thread() is on_main(),
    )
    parts.wrap(
        generator.executor,
        "collective_rpc",
        "RPCs",
        only=lambda a, k: bool(a) and (a[0] == "_reset_capture" or (a[0] == "_staged_captures" and final.is_set())),
    )


def set_environment(args) -> None:
    if args.runner != "auto":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if args.runner == "v2" else "0"
    for key, value in {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }.items():
        os.environ.setdefault(key, value)


def prompt_rounds(args, config: dict) -> tuple[list[list[int]], list[list[list[int]]]]:
    """The warm-up batch and the prompts split into ``--rounds`` rounds (seeded, the same in
    every process)."""
    data = dataset(args.prompts + args.batch, config["vocab_size"])
    warmup, prompts = data[: args.batch], data[args.batch :]
    per_round = len(prompts) // args.rounds
    return warmup, [prompts[r * per_round : (r + 1) * per_round] for r in range(args.rounds)]


def child(args) -> None:
    """One engine (``args.child``) in this process: start, warm up, time every batch; prints
    its figures as one JSON line after ``ROW_MARK``."""
    import torch

    cuda = torch.cuda.is_available()
    model = Path(args.model_dir)
    config = json.loads((model / "config.json").read_text())
    layers, hidden = args.layers, config["hidden_size"]
    warmup, rounds = prompt_rounds(args, config)
    peak = Peak()
    if cuda:
        peak.start()
    figures = {"row": args.child, "pid": os.getpid()}
    t = time.perf_counter()
    if args.child == "generator":
        engine = start_generator(model, layers, args.gpu_share)
    else:
        extract = extract_config(layers, Path(args.storage), cuda) if args.child == "extract" else None
        engine = start_vllm(model, args.gpu_share, eager=args.child == "eager", extract=extract)
    figures["start_s"] = round(time.perf_counter() - t, 1)
    print(f"{args.child}: engine started in {figures['start_s']} s", flush=True)
    if args.child == "generator":
        call = lambda batch: run_generator(engine, batch, hidden)  # noqa: E731
    elif args.child == "extract":
        call = lambda batch: run_extract(engine, batch, hidden, len(layers))  # noqa: E731
    else:
        call = lambda batch: run_vllm(engine, batch)  # noqa: E731
    call(warmup)
    timers = host = ring = None
    if args.child == "generator":
        timers, host, ring = instrument(engine)
    seconds, tokens, captured = [], [], 0
    for prompts in rounds:
        t = time.perf_counter()
        for i in range(0, len(prompts), args.batch):
            captured = max(captured, call(prompts[i : i + args.batch]) or 0)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t)
        tokens.append(sum(map(len, prompts)))
    peak.stop.set()
    total_s = sum(seconds)
    figures.update(
        {
            "tokens": sum(tokens),
            "seconds": round(total_s, 3),
            "tokens_per_s": round(sum(tokens) / total_s),
            "round_tokens_per_s": [round(n / s) for n, s in zip(tokens, seconds, strict=True)],
            "peak_device_gib": round(peak.device / 2**30, 1),
            "captured_per_call_gib": round(captured / 2**30, 3),
        }
    )
    if timers is not None:
        where = dict(timers.seconds)
        where["rest of generate()"] = total_s - sum(where.values())
        figures["generator_seconds"] = {k: round(v, 2) for k, v in where.items()}
        figures["collect_parts"] = {k: round(v, 3) for k, v in getattr(timers, "parts", Timers()).seconds.items()}
        figures["transfer"] = "shared host memory (SP028/SP029)" if ring is not None else "RPC"
    print(ROW_MARK + json.dumps(figures), flush=True)
    if args.child == "generator":
        engine.executor.shutdown()


def storage_dir(tmp: Path, need: int) -> Path:
    """Where the extract route's connector writes: /dev/shm if it has ``need`` bytes free, else
    a directory under ``tmp``."""
    if SHM.is_dir() and os.access(SHM, os.W_OK) and shutil.disk_usage(SHM).free >= need:
        return Path(tempfile.mkdtemp(prefix="gpu-bench-", dir=SHM))
    return tmp / "hidden-states"


def run_child(command: list[str], out, env: dict, timeout: float) -> int | str:
    """Run one row's process in its own process group; its exit code, or "timeout". Whatever
    of the group is left when it ends (vLLM's engine core and workers after a timeout or a
    crash) is killed, so that the next row finds the GPU free."""
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline, timed_out = time.monotonic() + timeout, False
    # Wait without reaping it: its pid, the group's id, stays ours until the group is killed.
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(0.5)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    code = proc.wait()
    return "timeout" if timed_out else code


def separate(args, config: dict, layers: list[int], label: str) -> None:
    """One child process per row, one after another; the table and the ratios."""
    import torch

    cuda = torch.cuda.is_available()
    warmup, rounds = prompt_rounds(args, config)
    batch_tokens = max(
        sum(map(len, warmup)),
        *(sum(map(len, r[i : i + args.batch])) for r in rounds for i in range(0, len(r), args.batch)),
    )
    flop = 2 * active_params(config)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model", config)
        # One call's files: tokens x layers x hidden x 2 bytes (bf16), with room to spare.
        storage = storage_dir(Path(tmp), 2 * batch_tokens * len(layers) * config["hidden_size"] * 2)
        logs = Path(args.logs) if args.logs else Path(tmp) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])),
        }
        print(
            f"{label}: {sum(map(len, rounds))} prompts, {sum(len(p) for r in rounds for p in r):,} tokens, batches of "
            f"{args.batch}, layers {layers}, one engine per process at GPU share {args.gpu_share}; "
            f"extract route files in {storage}",
            flush=True,
        )
        try:
            for row in args.rows:
                if row == "extract" and (why := extract_missing()):
                    results[row] = {"row": row, "skipped": why}
                    print(f"{row}: skipped: {why}", flush=True)
                    continue
                command = [
                    sys.executable, __file__, "--child", row, "--model-dir", str(model), "--storage", str(storage),
                    "--layers", *map(str, layers), "--prompts", str(args.prompts), "--batch", str(args.batch),
                    "--rounds", str(args.rounds), "--gpu-share", str(args.gpu_share), "--runner", args.runner,
                ]  # fmt: skip
                log = logs / f"{row}.log"
                began = time.time()
                with log.open("w") as out:
                    code = run_child(command, out, env, args.child_timeout)
                text = log.read_text(errors="replace")
                found = [line[len(ROW_MARK) :] for line in text.splitlines() if line.startswith(ROW_MARK)]
                if found and code == 0:
                    results[row] = {**json.loads(found[-1]), "wall_s": round(time.time() - began, 1)}
                    r = results[row]
                    print(
                        f"{row}: {r['tokens_per_s']:,} tok/s, engine start {r['start_s']} s, process {r['wall_s']} s",
                        flush=True,
                    )
                else:
                    errors = dict.fromkeys(
                        line for line in text.splitlines() if "Error:" in line and "WARNING" not in line
                    )
                    tail = "\n".join([*list(errors)[:6], "...", *text.splitlines()[-12:]])
                    results[row] = {"row": row, "failed": f"exit {code}", "wall_s": round(time.time() - began, 1)}
                    print(
                        f"{row}: FAILED (exit {code}) after {results[row]['wall_s']} s; the end of its log ({log}):\n{tail}",
                        flush=True,
                    )
        finally:
            if storage.parent == SHM:
                shutil.rmtree(storage, ignore_errors=True)
    device = torch.cuda.get_device_name(0) if cuda else "none (CPU engine)"
    print(f"\nGPU {device}; vLLM {_vllm_version()}; {label}; {flop / 2:.3g} active decoder parameters per token")
    print("| row | engine | start s | tok/s | MFU | generator / it |\n|---|---|---|---|---|---|")
    gen = results.get("generator", {}).get("tokens_per_s")
    names = ROW_NAMES if cuda else {**ROW_NAMES, **CPU_ROW_NAMES}
    for row in args.rows:
        r = results[row]
        if "tokens_per_s" not in r:
            print(f"| {row} | {names[row]} | - | {r.get('skipped') or r.get('failed')} | - | - |")
            continue
        r["mfu"] = round(r["tokens_per_s"] * flop / PEAK_BF16, 4)
        ratio = f"{gen / r['tokens_per_s']:.3f}" if gen and row != "generator" else "-"
        print(f"| {row} | {names[row]} | {r['start_s']} | {r['tokens_per_s']:,} | {r['mfu']:.1%} | {ratio} |")
    ratios = {
        f"generator/{row}": round(gen / results[row]["tokens_per_s"], 4)
        for row in ("default", "extract", "eager")
        if gen and "tokens_per_s" in results.get(row, {})
    }
    print("ratios: " + (", ".join(f"{k} {v:.3f}" for k, v in ratios.items()) or "none (a row is missing)"))
    where = results.get("generator", {}).get("generator_seconds")
    if where:
        total = results["generator"]["seconds"]
        print("generator time: " + ", ".join(f"{k} {v:.1f} s ({v / total:.0%})" for k, v in where.items()))
        parts = results["generator"].get("collect_parts")
        if parts:
            print("of collect: " + ", ".join(f"{k} {v:.3f} s" for k, v in parts.items()))
    figures = {
        "mode": "separate",
        "gpu": device,
        "vllm": _vllm_version(),
        "model": label,
        "active_params": active_params(config),
        "prompts": sum(map(len, rounds)),
        "tokens": sum(len(p) for r in rounds for p in r),
        "batch": args.batch,
        "layers": layers,
        "gpu_share": args.gpu_share,
        "runner": args.runner,
        "rows": results,
        "ratios": ratios,
    }
    print(MARK + json.dumps(figures), flush=True)
    if any("failed" in r for r in results.values()):
        sys.exit(1)


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def paired(args, config: dict, layers: list[int], label: str) -> None:
    """vLLM's eager engine and the generator in this one process (module docstring)."""
    import torch

    cuda = torch.cuda.is_available()
    warmup, rounds = prompt_rounds(args, config)
    peak = Peak()
    if cuda:
        peak.start()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model", config)
        t = time.perf_counter()
        generator = start_generator(model, layers, args.gpu_share)
        start_gen = time.perf_counter() - t
        t = time.perf_counter()
        llm = start_vllm(model, args.gpu_share)
        start_llm = time.perf_counter() - t
        hidden = config["hidden_size"]
        memory = HostMemory()
        rss_started = memory.process.memory_info().rss  # both engines up, no generate() call yet
        memory.start()
        run_generator(generator, warmup, hidden)
        run_vllm(llm, warmup)
        timers, host, ring = instrument(generator)
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
        flop = 2 * active_params(config)
        gen_tps, llm_tps = tokens / gen_s, tokens / llm_s
        where = dict(timers.seconds)
        where["rest of generate()"] = gen_s - sum(where.values())
        figures = {
            "mode": "paired",
            "gpu": torch.cuda.get_device_name(0) if cuda else "none (CPU engine)",
            "prompts": sum(map(len, rounds)),
            "tokens": tokens,
            "batch": args.batch,
            "rounds": args.rounds,
            "layers": layers,
            "model": label,
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
            "collect_parts": {k: round(v, 3) for k, v in getattr(timers, "parts", Timers()).seconds.items()},
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
        if figures["collect_parts"]:
            print("of collect: " + ", ".join(f"{k} {v:.3f} s" for k, v in figures["collect_parts"].items()))
        print(MARK + json.dumps(figures), flush=True)
        generator.executor.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mode",
        choices=("paired", "separate"),
        default="paired",
        help="paired: vLLM eager and the generator in one process; separate: one engine per process, one after another",
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="llama8b", help="the model's shapes")
    parser.add_argument(
        "--rows", default=",".join(ROWS), help=f"separate mode: which engines, in order ({','.join(ROWS)})"
    )
    parser.add_argument("--prompts", type=int, default=480)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64, help="prompts per generate() call")
    parser.add_argument(
        "--gpu-share", type=float, help="gpu_memory_utilization of each engine (paired 0.45, separate 0.8)"
    )
    parser.add_argument("--tiny", action="store_true", help="tiny models on any device: checks the script only")
    parser.add_argument("--logs", help="separate mode: keep each child's log in this directory")
    parser.add_argument("--child-timeout", type=float, default=900, help="separate mode: seconds one child may take")
    parser.add_argument(
        "--runner",
        choices=("auto", "v1", "v2"),
        default="auto",
        help="the GPU model runner of every engine (VLLM_USE_V2_MODEL_RUNNER; auto: vLLM's choice)",
    )
    # One row of the separate mode (the parent starts these).
    parser.add_argument("--child", choices=ROWS, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--storage", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.rows = [row.strip() for row in args.rows.split(",") if row.strip()]
    if unknown := [row for row in args.rows if row not in ROWS]:
        parser.error(f"unknown rows {unknown} (choose from {', '.join(ROWS)})")
    if args.gpu_share is None:
        args.gpu_share = GPU_SHARE[args.mode]
    set_environment(args)
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    if args.child:
        child(args)
        return
    config, layers, label = (TINY_MODELS if args.tiny else MODELS)[args.model]
    (separate if args.mode == "separate" else paired)(args, config, layers, label)


if __name__ == "__main__":
    main()

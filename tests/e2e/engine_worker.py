"""Runs inside a target environment (speculators + the real vLLM 0.16 CPU engine).

Not a pytest module: ``tests/e2e/test_engine.py`` starts it with the target's Python.

    python engine_worker.py CONFIG MODELS_DIR OUT_JSON

CONFIG names a generator configuration below. The worker builds one
``speculators.data_generation.VllmHiddenStatesGenerator`` through its public constructor,
calls the unmodified ``generate(token_ids)`` for each batch of the configuration, then
computes an independent reference for every prompt and writes per (call, request, layer)
shape checks and per-token cosine similarities to OUT_JSON.

References:
- ``hf``: Hugging Face transformers, bf16 (vLLM's CPU dtype), each prompt alone, the output of
  decoder layer i taken with a forward hook on transformers' layer (equal to
  ``output_hidden_states[i + 1]`` for every layer but the last, whose ``hidden_states`` entry
  transformers returns after the final norm; both are recorded and cross-checked).
- ``vllm``: vLLM's own model forward, unmodified, through ``vllm.LLM`` as a token-embedding
  pooling model (per-token final hidden states, after the final norm). Layer i's reference is
  the pooled output of the same checkpoint truncated to its first i + 1 layers. Used where
  transformers lacks the feature (DeepSeek-V3 with ``llama_4_scaling``). The final norm's
  weight is all ones in these checkpoints, so norm(x) = x / rms(x): the captured state is
  compared after applying the same normalisation, and the cosine is unaffected by it.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def prompts(seed: int, lengths: list[int], vocab: int = 512) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(n)] for n in lengths]


MIXED = [1, 7, 33, 129, 300, 64]  # several lengths, one single-token prompt
# 24 prompts of 300-510 tokens: 9,9xx tokens > the 8,192-token budget 0.3.0 configures
# (max(8192, max_model_len)): vLLM chunks one prompt across steps and orders requests in
# its own batch order. The case REFERENCE item 10 measured 9/72 wrong captures on.
CHUNKED = list(range(300, 511, 9))[:24]

CONFIGS = {
    "llama-tp2": {
        "model": "llama",
        "tp": 2,
        "layers": [0, 3, 5],
        "reference": "hf",
        "calls": [("mixed", 21, MIXED), ("chunked", 22, CHUNKED)],
    },
    "deepseek-v3-l4s-tp1": {
        "model": "deepseek_v3_l4s",
        "tp": 1,
        "layers": [0, 3],
        "reference": "vllm",
        "calls": [("mixed", 41, MIXED)],
    },
    # A vision-language wrapper: vLLM's LlavaForConditionalGeneration, text model reached via
    # get_language_model() (the path Kimi-K2.5 takes); text-only prompts.
    "llava-tp1": {
        "model": "llava",
        "tp": 1,
        "layers": [0, 2, 5],
        "reference": "hf",
        "calls": [("mixed", 61, MIXED)],
    },
    # A KV cache too small for the 480-token prompt (about 100 tokens of room): vLLM cannot
    # run that prompt whole, so the generator must raise rather than return short or
    # shifted rows. The 20-token prompt fits.
    "kv-starved": {
        "model": "llama",
        "tp": 1,
        "layers": [0, 5],
        "reference": None,
        "gpu_memory_utilization": 0.0015,
        "calls": [("starved", 51, [20, 480])],
    },
}

MAX_MODEL_LEN = 512


def env_for(config: dict) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if config["model"].startswith("deepseek"):
        os.environ["VLLM_MLA_DISABLE"] = "1"  # MLA attention has no CPU backend
    if config["tp"] == 2:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")


def cosine_rows(a, b):
    import torch

    a = a.float()
    b = b.float()
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)


def hf_reference(model_dir: Path, layers: list[int], batches: list[list[list[int]]]):
    """Per batch, per prompt: {layer: tensor [tokens, hidden]} from transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    if json.loads((model_dir / "config.json").read_text())["model_type"] == "llava":
        from transformers import LlavaForConditionalGeneration as model_class
    else:
        model_class = AutoModelForCausalLM
    model = model_class.from_pretrained(model_dir, dtype=torch.bfloat16)
    model.eval()
    text = model.model.language_model if hasattr(model.model, "language_model") else model.model
    num_layers = text.config.num_hidden_layers
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        text.layers[i].register_forward_hook(
            lambda mod, args, out, i=i: seen.__setitem__(i, (out[0] if isinstance(out, tuple) else out)[0])
        )
        for i in layers
    ]
    out = []
    max_hook_vs_hidden_states = 0.0
    with torch.no_grad():
        for batch in batches:
            refs = []
            for ids in batch:
                seen.clear()
                res = model(torch.tensor([ids]), output_hidden_states=True)
                for i in layers:
                    if i < num_layers - 1:  # hidden_states[num_layers] is after the final norm
                        diff = (res.hidden_states[i + 1][0].float() - seen[i].float()).abs().max().item()
                        max_hook_vs_hidden_states = max(max_hook_vs_hidden_states, diff)
                refs.append({i: seen[i].clone() for i in layers})
            out.append(refs)
    for h in hooks:
        h.remove()
    return out, {"hook_vs_output_hidden_states_max_abs_diff": max_hook_vs_hidden_states}


def vllm_reference(model_dir: Path, layers: list[int], batches: list[list[list[int]]], tmp: Path):
    """Per batch, per prompt: {layer: normalised final hidden states of the truncated model}."""
    import gc
    import shutil

    from safetensors.torch import load_file, save_file
    from vllm import LLM
    from vllm.config import PoolerConfig
    from vllm.inputs import TokensPrompt

    config = json.loads((model_dir / "config.json").read_text())
    out = [[{} for _ in batch] for batch in batches]
    for layer in layers:
        sub = tmp / f"{model_dir.name}-first-{layer + 1}-layers"
        if not (sub / "config.json").exists():
            shutil.copytree(
                model_dir, sub, ignore=shutil.ignore_patterns("model.safetensors", ".complete"), dirs_exist_ok=True
            )
            weights = load_file(str(model_dir / "model.safetensors"))
            keep = {
                k: v for k, v in weights.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) <= layer
            }
            save_file(keep, str(sub / "model.safetensors"), metadata={"format": "pt"})
            (sub / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layer + 1}))
        # block_size 16, as the generator runs on 0.16 (SP021): with vLLM's default (a multiple of 32)
        # the plain vllm-cpu build picks an AMX attention kernel on CPUs that have AMX, which it was
        # not built with ("Unsupported CPU attention configuration: head_dim=64 isa=0").
        llm = LLM(
            model=str(sub),
            runner="pooling",
            convert="embed",
            enforce_eager=True,
            block_size=16,
            max_model_len=MAX_MODEL_LEN,
            enable_prefix_caching=False,
            pooler_config=PoolerConfig(pooling_type="ALL", use_activation=False),
        )
        for b, batch in enumerate(batches):
            results = llm.encode(
                [TokensPrompt(prompt_token_ids=ids) for ids in batch], pooling_task="token_embed", use_tqdm=False
            )
            for p, res in enumerate(results):
                out[b][p][layer] = res.outputs.data.clone()
        del llm
        gc.collect()
    return out, {}


def rms_normalise(x):
    import torch

    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def main() -> int:
    name, models_dir, out_json = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    config = CONFIGS[name]
    env_for(config)
    sys.path.insert(0, str(HERE.parent.parent / "fixtures"))
    import models as model_fixtures  # noqa: E402  (fixtures/models.py)

    model_dir = model_fixtures.build(config["model"], models_dir)
    report: dict = {"config": name, "model": config["model"], "tp": config["tp"], "layers": config["layers"]}
    t0 = time.time()
    try:
        from speculators.data_generation import VllmHiddenStatesGenerator

        generator = VllmHiddenStatesGenerator(
            str(model_dir),
            layer_ids=config["layers"],
            max_model_len=MAX_MODEL_LEN,
            tensor_parallel_size=config["tp"],
            gpu_memory_utilization=config.get("gpu_memory_utilization", 0.8),
        )
    except Exception as exc:  # the unpatched case: record what the user sees
        report["error"] = {"type": type(exc).__name__, "message": str(exc)}
        out_json.write_text(json.dumps(report, indent=1))
        return 0
    report["startup_s"] = round(time.time() - t0, 1)

    # Observe (not alter) what the engine does: the scheduler steps and their token counts.
    steps: list[dict[str, int]] = []
    execute_model = generator.executor.execute_model

    def observed(scheduler_output, *args, **kwargs):
        steps.append(dict(scheduler_output.num_scheduled_tokens))
        return execute_model(scheduler_output, *args, **kwargs)

    generator.executor.execute_model = observed

    batches, outputs, calls = [], [], []
    for call_name, seed, lengths in config["calls"]:
        batch = prompts(seed, lengths)
        steps.clear()
        t = time.time()
        try:
            result = generator.generate(batch)
        except Exception as exc:
            report["error"] = {
                "type": type(exc).__name__,
                "message": str(exc),
                "call": call_name,
                "steps": len(steps),
                "kv_cache_blocks": generator.vllm_config.cache_config.num_gpu_blocks,
            }
            generator.executor.shutdown()
            out_json.write_text(json.dumps(report, indent=1))
            return 0
        elapsed = time.time() - t
        split = sum(1 for rid in {r for s in steps for r in s} if sum(rid in s for s in steps) > 1)
        calls.append(
            {
                "name": call_name,
                "prompts": len(batch),
                "tokens": sum(lengths),
                "steps": len(steps),
                "step_tokens": [sum(s.values()) for s in steps],
                "requests_split_across_steps": split,
                "seconds": round(elapsed, 2),
            }
        )
        batches.append(batch)
        outputs.append(result)
    model_dtype = generator.vllm_config.model_config.dtype
    generator.executor.shutdown()
    del generator
    # The same batch twice on one generator: the results must be identical.
    seen: dict[tuple, list] = {}
    for (call_name, seed, lengths), result in zip(config["calls"], outputs, strict=False):
        key = (seed, tuple(lengths))
        if key in seen:
            diffs = [
                (a.float() - b.float()).abs().max().item()
                for r0, r1 in zip(seen[key], result, strict=False)
                for a, b in zip(r0["hidden_states"], r1["hidden_states"], strict=False)
            ]
            report.setdefault("repeat_max_abs_diff", {})[call_name] = max(diffs)
        seen.setdefault(key, result)
    if config["reference"] is None:
        report["calls"] = calls
        out_json.write_text(json.dumps(report, indent=1))
        return 0

    if config["reference"] == "hf":
        refs, ref_info = hf_reference(model_dir, config["layers"], batches)
        transform = lambda x: x.float()  # noqa: E731
    else:
        refs, ref_info = vllm_reference(model_dir, config["layers"], batches, models_dir / "_truncated")
        transform = rms_normalise
    report["reference"] = {"kind": config["reference"], **ref_info}

    worst = 1.0
    for call, batch, result, ref in zip(calls, batches, outputs, refs, strict=False):
        call["results"] = len(result)
        call["input_ids_match"] = all(r["input_ids"].tolist() == ids for r, ids in zip(result, batch, strict=False))
        call["per_layer_count_ok"] = all(len(r["hidden_states"]) == len(config["layers"]) for r in result)
        # What speculators 0.3.0's generate() returns (h.cpu() of one tensor per request and layer), so
        # that its data-generation script's torch.save writes the same files: CPU, contiguous, the
        # model's dtype, each tensor alone in a storage of exactly its own size.
        call["returns_as_0_3_0"] = all(
            h.device.type == "cpu"
            and h.is_contiguous()
            and h.dtype == model_dtype
            and h.storage_offset() == 0
            and h.untyped_storage().nbytes() == h.numel() * h.element_size()
            for r in result
            for h in r["hidden_states"]
        )
        shapes_ok, cos_min = True, 1.0
        per_request = []
        for r, ids, rref in zip(result, batch, ref, strict=False):
            row = []
            for layer, got in zip(sorted(config["layers"]), r["hidden_states"], strict=False):
                want = rref[layer]
                ok = tuple(got.shape) == tuple(want.shape) and got.shape[0] == len(ids)
                shapes_ok &= ok
                c = cosine_rows(transform(got), want).min().item() if ok else float("nan")
                cos_min = min(cos_min, c) if ok else cos_min
                row.append(round(c, 6))
            per_request.append(row)
        call["shapes_ok"] = shapes_ok
        call["min_cosine"] = cos_min
        call["min_cosine_per_request_layer"] = per_request
        worst = min(worst, cos_min)
    if config["model"] == "deepseek_v3_l4s":
        # Show the scaling matters: the same tokens' captures vs the model without it (HF).
        plain, _ = hf_reference(models_dir / "deepseek_v3", config["layers"], batches[:1])
        deltas = []
        for r, rref in zip(outputs[0], plain[0], strict=False):
            for layer, got in zip(sorted(config["layers"]), r["hidden_states"], strict=False):
                deltas.append(cosine_rows(got, rref[layer]).min().item())
        report["without_scaling_min_cosine"] = min(deltas)
    report["calls"] = calls
    report["min_cosine"] = worst
    report["total_s"] = round(time.time() - t0, 1)
    out_json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

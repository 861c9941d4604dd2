"""EAGLE-3 draft acceptance on vLLM: speculators' whole pipeline on the patched install, one GPU.

Runs under the target's interpreter (torch with CUDA, vLLM, speculators patched by
``speculators-patch apply``), from a checkout of this project:

    /path/to/env/bin/python benchmarks/draft_acceptance.py [--epochs 5] [--prompts 256] [--workdir DIR]

1. The verifier: selftest's tiny Llama (``patcher/agent/selftest/tiny_models.py``: 6 layers of
   128, vocabulary 512, seeded random weights, a WordLevel tokenizer).
2. Its own text: ``--prompts`` random 16-token prompts continued by the verifier itself
   (transformers ``generate``, sampled at temperature 0.7, 112 new tokens).
3. Hidden states: speculators' ``VllmHiddenStatesGenerator`` on those sequences (layers 1, 2, 3 and
   the last), saved as its data-generation script saves them.
4. Training: speculators' own ``Eagle3SampleFileDataset``, packing sampler, ``Eagle3DraftModel``
   (one layer, 256 draft tokens, 3 TTT steps, ``eagle_aux_hidden_state_layer_ids`` = the captured
   layers + 1, vLLM's numbering of the same hidden states) and ``Trainer`` for ``--epochs``
   epochs; the untrained draft is saved by the same checkpointer first.
5. Serving: each draft served by vLLM as its EAGLE-3 speculator (the command the README gives:
   the verifier as the model, the draft as ``speculative_config``, method ``eagle3``), greedy, on
   64 fresh prompts, 96 tokens each; one engine per process, one after the other. Acceptance
   from vLLM's spec-decode counters: mean accepted draft tokens per step (``accepted / drafts``),
   the acceptance rate (``accepted / draft tokens``) and per position.

Printed: each stage's time, the trainer's loss first -> last, and per draft the acceptance
figures; a JSON line after ``@@draft-acceptance`` has every figure. Exit 1 when a stage fails or
the trained draft does not accept more tokens per step than the untrained one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "@@draft-acceptance"
CAPTURED = [1, 2, 3]  # the generator's layer ids (outputs of those decoder layers); the last layer is added
SPECULATIVE_TOKENS = 3
SEQ_LEN = 512
SERVE_PROMPTS, SERVE_TOKENS = 64, 96
ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "TQDM_DISABLE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def log(message: str) -> None:
    print(f"[acceptance] {message}", flush=True)


def _selftest_module(name: str):
    """A module of selftest's package (``patcher/agent/selftest``), imported from this checkout
    without the rest of the tool (the target has none of the controller's libraries)."""
    import importlib.util

    package = ROOT / "patcher" / "agent" / "selftest"
    if "speculators_patch_selftest" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "speculators_patch_selftest", package / "__init__.py", submodule_search_locations=[str(package)]
        )
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
    return importlib.import_module(f"speculators_patch_selftest.{name}")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def verifier(workdir: Path) -> tuple[Path, dict]:
    tiny_models = _selftest_module("tiny_models")

    path = workdir / "verifier"
    if not path.exists():
        tiny_models.build("llama", path, device="cuda" if _cuda() else "cpu")
    return path, json.loads((path / "config.json").read_text())


def continuations(model_dir: Path, prompts: int, vocab: int, seed: int) -> list[list[int]]:
    """``prompts`` sequences of 128 tokens: 16 random ones, then what the verifier samples."""
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16).to(device).eval()
    rng = random.Random(seed)
    start = torch.tensor([[rng.randrange(4, vocab) for _ in range(16)] for _ in range(prompts)]).to(device)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            start,
            attention_mask=torch.ones_like(start),
            max_new_tokens=112,
            min_new_tokens=112,
            do_sample=True,
            temperature=0.7,
            top_k=0,
            pad_token_id=0,
        )
    del model
    return out.tolist()


def capture(model_dir: Path, sequences: list[list[int]], layers: list[int], datadir: Path) -> list[str]:
    """speculators' generator on ``sequences``; one data file per sequence, as its script writes."""
    import torch
    from speculators.data_generation import VllmHiddenStatesGenerator

    datadir.mkdir(parents=True, exist_ok=True)
    generator = VllmHiddenStatesGenerator(
        str(model_dir), layer_ids=layers, max_model_len=SEQ_LEN, gpu_memory_utilization=0.2
    )
    files = []
    try:
        for start in range(0, len(sequences), 64):
            for result in generator.generate(sequences[start : start + 64]):
                ids = result["input_ids"]
                path = datadir / f"data_{len(files)}.pt"
                torch.save(
                    {
                        "input_ids": ids,
                        "hidden_states": [h.contiguous() for h in result["hidden_states"]],
                        "loss_mask": torch.ones_like(ids),
                    },
                    path,
                )
                files.append(str(path))
    finally:
        generator.executor.shutdown()
    return files


def draft_config(model_dir: Path, text: dict):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layer = LlamaConfig(
        vocab_size=text["vocab_size"],
        hidden_size=text["hidden_size"],
        intermediate_size=text["intermediate_size"],
        num_hidden_layers=1,
        num_attention_heads=text["num_attention_heads"],
        num_key_value_heads=text["num_key_value_heads"],
        max_position_embeddings=text["max_position_embeddings"],
        rms_norm_eps=text["rms_norm_eps"],
        head_dim=text["hidden_size"] // text["num_attention_heads"],
    )
    layer._attn_implementation = "simple_flex_attention"
    return Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=256,
        norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=[i + 1 for i in CAPTURED],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=SPECULATIVE_TOKENS)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(model_dir), architectures=["LlamaForCausalLM"]),
        ),
    )


def train(model_dir: Path, text: dict, files: list[str], workdir: Path, epochs: int) -> dict:
    """The untrained draft saved, then ``epochs`` epochs of speculators' Trainer; the loss of
    every step (the trainer's metrics log)."""
    import logging
    from collections import Counter

    import torch
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.checkpointer import SingleGPUCheckpointer
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from speculators.train.trainer import Trainer, TrainerConfig
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq: Counter = Counter()
    for f in files:
        freq.update(torch.load(f, weights_only=True)["input_ids"].tolist())
    d2t, t2d = build_vocab_mappings_from_distribution(dict(freq), 256, text["vocab_size"])
    torch.manual_seed(0)
    model = Eagle3DraftModel(config=draft_config(model_dir, text), t2d=t2d, d2t=d2t)
    SingleGPUCheckpointer(workdir / "untrained").save_checkpoint(model, torch.optim.AdamW(model.parameters()), 0)
    dataset = Eagle3SampleFileDataset(max_len=SEQ_LEN, file_list=files, hidden_states_dtype=torch.float32)
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=SEQ_LEN, lengths=dataset.approx_lengths, num_replicas=1, rank=0
    )
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=create_collate_fn(SEQ_LEN))
    losses: list = []

    class Losses(logging.Handler):
        def emit(self, record):
            if isinstance(record.msg, dict) and "train" in record.msg:
                losses.append(record.msg["train"]["loss"])

    metrics = logging.getLogger("speculators.metrics")
    metrics.addHandler(Losses())
    metrics.setLevel(logging.INFO)
    kwargs = {"ttt_steps": SPECULATIVE_TOKENS}
    config = TrainerConfig(
        lr=1e-3, num_epochs=epochs, save_path=str(workdir / "trained"), train_call_kwargs=kwargs, val_call_kwargs=kwargs
    )
    Trainer(model, config, loader, None).run_training()
    return {
        "steps": len(losses),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses[:: max(1, len(losses) // 20)],
    }


def serve(verifier_dir: str, draft_dir: str, prompts_file: str) -> dict:
    """One vLLM engine serving ``draft_dir`` as the EAGLE-3 speculator of ``verifier_dir``."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = json.loads(Path(prompts_file).read_text())
    t = time.time()
    llm = LLM(
        model=verifier_dir,
        speculative_config={"method": "eagle3", "model": draft_dir, "num_speculative_tokens": SPECULATIVE_TOKENS},
        enforce_eager=True,
        disable_log_stats=False,
        gpu_memory_utilization=0.3,
        max_model_len=SEQ_LEN,
    )
    started = time.time() - t
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=SERVE_TOKENS),
        use_tqdm=False,  # vLLM 0.34 divides by the bar's elapsed time, 0 under TQDM_DISABLE
    )
    found: dict = {"engine_start_s": round(started, 1), "outputs": [list(o.outputs[0].token_ids) for o in outs]}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            found[metric.name] = getattr(metric, "values", None) or getattr(metric, "value", None)
    drafts = found.get("vllm:spec_decode_num_drafts") or 0
    accepted = found.get("vllm:spec_decode_num_accepted_tokens") or 0
    proposed = found.get("vllm:spec_decode_num_draft_tokens") or 0
    found["mean_accepted_per_step"] = accepted / drafts if drafts else None
    found["acceptance_rate"] = accepted / proposed if proposed else None
    per_pos = found.get("vllm:spec_decode_num_accepted_tokens_per_pos")
    found["acceptance_per_position"] = [x / drafts for x in per_pos] if per_pos and drafts else None
    return found


def serve_in_process(verifier_dir: Path, draft_dir: Path, prompts_file: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--serve", str(verifier_dir), str(draft_dir), str(prompts_file)],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        timeout=600,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-30:]
    raise RuntimeError(f"serving {draft_dir} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def newest(checkpoints: Path) -> Path:
    return max((d for d in checkpoints.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))


def main(args: argparse.Namespace) -> int:
    os.environ.update(ENV)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    figures: dict = {"seconds": {}}
    t = time.time()
    model_dir, text = verifier(workdir)
    sequences = continuations(model_dir, args.prompts, text["vocab_size"], seed=1)
    figures["seconds"]["verifier_text"] = round(time.time() - t, 1)
    log(
        f"verifier {text['num_hidden_layers']} layers x {text['hidden_size']}: {len(sequences)} sequences of its own text"
    )
    t = time.time()
    layers = CAPTURED + [text["num_hidden_layers"] - 1]
    files = capture(model_dir, sequences, layers, workdir / "data")
    figures["seconds"]["capture"] = round(time.time() - t, 1)
    log(f"captured layers {layers} of {len(files)} sequences with speculators' generator")
    t = time.time()
    figures["training"] = train(model_dir, text, files, workdir, args.epochs)
    figures["seconds"]["training"] = round(time.time() - t, 1)
    tr = figures["training"]
    log(f"trained {tr['steps']} steps: loss {tr['loss_first']:.4f} -> {tr['loss_last']:.4f}")
    rng = random.Random(7)
    prompts = [[rng.randrange(4, text["vocab_size"]) for _ in range(16)] for _ in range(SERVE_PROMPTS)]
    prompts_file = workdir / "serve-prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    for name in ("untrained", "trained"):
        t = time.time()
        draft = newest(workdir / name)
        figures[name] = serve_in_process(model_dir, draft, prompts_file)
        figures["seconds"][f"serve_{name}"] = round(time.time() - t, 1)
        f = figures[name]
        log(
            f"{name} draft ({draft}): {f['mean_accepted_per_step']:.3f} accepted tokens per step, acceptance rate "
            f"{f['acceptance_rate']:.3f}, per position {[round(x, 3) for x in f['acceptance_per_position'] or []]}"
        )
    same = sum(
        a == b for a, b in zip(figures["untrained"].pop("outputs"), figures["trained"].pop("outputs"), strict=True)
    )
    figures["greedy_outputs_identical"] = f"{same}/{SERVE_PROMPTS}"
    log(f"greedy outputs identical with either draft: {same} of {SERVE_PROMPTS}")
    print(MARKER + json.dumps(figures), flush=True)
    better = figures["trained"]["mean_accepted_per_step"] > figures["untrained"]["mean_accepted_per_step"]
    return 0 if better else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        print(MARKER + json.dumps(serve(*sys.argv[2:])), flush=True)
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--workdir", default="/tmp/draft-acceptance")
    sys.exit(main(parser.parse_args()))

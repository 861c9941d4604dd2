"""A verifier that has learned real text, built offline in minutes: a small Llama on the Python
standard library's sources.

Runs under the target's interpreter (torch, transformers, tokenizers; no network, no hub):

    /path/to/env/bin/python benchmarks/real_text_verifier.py --out DIR [--tiny] [--device cuda|cpu]

1. The corpus: every ``*.py`` file of this interpreter's standard library
   (``sysconfig.get_paths()["stdlib"]``, site-packages left out, tests included), sorted by
   path; its sha256 (over each path and its bytes, in order) and size are printed, since
   another Python release has another standard library. Each file goes to one side, picked
   by the sha256 of its path: about 3 % are held out for evaluation, about 20 % are the
   user's text (the draft's training prompts come from them), the rest train the verifier.
   Neither of the first two has a token the verifier trained on: a user trains a draft on
   prompts the verifier never memorised, and it is served on others again.
2. The tokenizer: a byte-level BPE trained on the training files with ``tokenizers``
   (``VOCAB`` tokens, ``<|endoftext|>`` between files), saved as transformers'
   ``PreTrainedTokenizerFast``.
3. The verifier: transformers' ``LlamaForCausalLM`` (head_dim 64, which vLLM's GPU and CPU
   attention take), trained from seeded weights on random windows of the training tokens
   (AdamW, bf16 autocast on a GPU, cosine schedule), saved in bf16 as a checkpoint that
   transformers and vLLM load.
4. Held-out loss: mean cross-entropy (nats per token) and top-1 accuracy on fixed windows of
   the held-out files, printed with the training loss.
5. Prompts: ``prompts.json`` beside the checkpoint, ``train`` windows (the draft's training
   prompts) from the user's files and ``heldout`` windows from the held-out files, each
   starting at a line start.

Deterministic: seeded windows, weights and prompts; the figures of one interpreter and device
repeat. ``--tiny``: a few-minute CPU run of the same code (1.5 MB of the corpus, 8 layers of
128, 60 steps). A JSON line after ``@@real-text-verifier`` has every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import sysconfig
import time
from pathlib import Path

MARKER = "@@real-text-verifier"
EOT = "<|endoftext|>"
HELD_OUT_PERCENT = 3  # files whose path hashes fall below this share are held out (evaluation)
USER_PERCENT = 20  # the next share: the user's text, the draft's training prompts
PROMPT_TOKENS = 64
# name -> sizes and schedule. "full": about 2 minutes on one H100 (31 M parameters,
# ~40 M training tokens); "tiny": the same code on a CPU in a few minutes.
SIZES = {
    "full": {
        "vocab": 4096,
        "hidden": 512,
        "layers": 8,
        "heads": 8,
        "intermediate": 1536,
        "seq": 512,
        "batch": 64,
        "steps": 1200,
        "lr": 1e-3,
        "corpus_bytes": None,
        "train_prompts": 4000,
        "heldout_prompts": 128,
        "eval_windows": 128,
    },
    "tiny": {
        "vocab": 512,
        "hidden": 128,
        "layers": 8,  # speculators' default layer ids [2, n/2, n-3, n-1] are distinct from 7 layers on
        "heads": 2,
        "intermediate": 256,
        "seq": 128,
        "batch": 8,
        "steps": 60,
        "lr": 2e-3,
        "corpus_bytes": 1_500_000,
        "train_prompts": 64,
        "heldout_prompts": 16,
        "eval_windows": 16,
    },
}


def log(message: str) -> None:
    print(f"[verifier] {message}", flush=True)


def corpus(limit_bytes: int | None = None) -> tuple[list[tuple[str, str]], dict]:
    """The standard library's ``*.py`` files as (path relative to the stdlib, text), sorted by
    path, at most ``limit_bytes`` of them (whole files, in order); and its description: root,
    files, bytes, sha256 (of each path, a NUL, its bytes and a NUL, in order)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    digest = hashlib.sha256()
    files, size = [], 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if {"site-packages", "dist-packages"} & set(rel.split("/")):
            continue
        data = path.read_bytes()
        if limit_bytes is not None and size + len(data) > limit_bytes:
            break
        digest.update(rel.encode() + b"\0" + data + b"\0")
        files.append((rel, data.decode("utf-8", errors="replace")))
        size += len(data)
    about = {
        "name": f"Python {sys.version.split()[0]} standard library sources (*.py, tests included)",
        "root": str(root),
        "files": len(files),
        "bytes": size,
        "sha256": digest.hexdigest(),
    }
    return files, about


def side(rel: str) -> str:
    """Which side a file is on: ``heldout`` (evaluation), ``user`` (the draft's training
    prompts) or ``verifier`` (trains the verifier); decided by its path alone, so a file keeps
    its side whatever else the corpus holds."""
    share = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % 100
    return "heldout" if share < HELD_OUT_PERCENT else "user" if share < HELD_OUT_PERCENT + USER_PERCENT else "verifier"


def train_tokenizer(texts: list[str], vocab: int):
    """A byte-level BPE of ``vocab`` tokens (``EOT`` is id 0) trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def token_stream(tok, texts: list[str]):
    """The texts' tokens, one file after another, ``EOT`` before each file (int32 tensor)."""
    import torch

    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.append(0)
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.int32)


def line_starts(tok, stream) -> list[int]:
    """Positions in ``stream`` right after a token that ends a line (byte-level BPE writes
    a newline as ``Ċ``)."""
    import torch

    newline = torch.zeros(tok.get_vocab_size(), dtype=torch.bool)
    for piece, i in tok.get_vocab().items():
        if piece.endswith("Ċ"):
            newline[i] = True
    return (torch.nonzero(newline[stream.long()]).flatten() + 1).tolist()


def prompts(stream, starts: list[int], count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` windows of ``length`` tokens of ``stream``, each at a line start, no window
    crossing into the next file (no ``EOT`` inside); seeded."""
    import random

    rng = random.Random(seed)
    found: list[list[int]] = []
    usable = [s for s in starts if s + length <= len(stream)]
    for _ in range(count * 20):
        if len(found) == count:
            break
        s = rng.choice(usable)
        window = stream[s : s + length].tolist()
        if 0 not in window:
            found.append(window)
    if len(found) < count:
        raise RuntimeError(f"only {len(found)} of {count} prompt windows found")
    return found


def llama_config(size: dict):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"],
        head_dim=size["hidden"] // size["heads"],
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )


def windows(stream, starts, seq: int):
    """Rows ``stream[s : s + seq + 1]`` for each start: inputs and shifted labels."""
    import torch

    return torch.stack([stream[s : s + seq + 1] for s in starts.tolist()]).long()


def evaluate(model, stream, size: dict, device: str) -> dict:
    """Mean next-token cross-entropy (nats) and top-1 accuracy over ``eval_windows`` fixed,
    evenly spaced windows of ``stream``."""
    import torch

    seq, count = size["seq"], size["eval_windows"]
    step = max(1, (len(stream) - seq - 1) // count)
    starts = torch.arange(0, step * count, step)[:count]
    starts = starts[starts + seq + 1 <= len(stream)]
    total = correct = tokens = 0.0
    model.eval()
    with torch.no_grad(), _autocast(device):
        for chunk in starts.split(size["batch"]):
            rows = windows(stream, chunk, seq).to(device)
            logits = model(rows[:, :-1]).logits.float()
            labels = rows[:, 1:]
            total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum").item()
            correct += (logits.argmax(-1) == labels).sum().item()
            tokens += labels.numel()
    model.train()
    return {"tokens": int(tokens), "loss": total / tokens, "top1": correct / tokens}


def _autocast(device: str):
    import contextlib

    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def train(train_stream, size: dict, device: str, seed: int):
    """The verifier trained from seeded weights for ``size["steps"]`` AdamW steps on random
    windows of ``train_stream`` (fp32 weights, bf16 autocast on a GPU). Returns (model,
    figures: steps, tokens, loss first and last (mean of 20 steps), seconds)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    # torch 2.14's cuDNN attention backward fails on a cuDNN older than the one it pins (an H100
    # image with cuDNN 9.19: CUDNN_STATUS_BAD_PARAM); FlashAttention serves the same shapes
    torch.backends.cuda.enable_cudnn_sdp(False)
    config = llama_config(size)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(device)
    steps, warmup = size["steps"], max(1, size["steps"] // 20)
    matrices = [p for p in model.parameters() if p.dim() >= 2]  # weight decay on these, none on the norms
    vectors = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
        lr=size["lr"],
        betas=(0.9, 0.95),
        **({"fused": True} if device == "cuda" else {}),
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    )
    gen = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    t = time.time()
    for step in range(steps):
        starts = torch.randint(0, len(train_stream) - size["seq"] - 1, (size["batch"],), generator=gen)
        rows = windows(train_stream, starts, size["seq"]).to(device, non_blocking=True)
        with _autocast(device):
            logits = model(rows[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item() if step % 10 == 0 or step >= steps - 20 or step < 20 else float("nan"))
        if step % max(1, steps // 10) == 0:
            log(f"step {step}/{steps}: loss {loss.item():.3f} ({time.time() - t:.0f} s)")
    first = [x for x in losses[:20] if x == x]
    last = [x for x in losses[-20:] if x == x]
    return model, {
        "steps": steps,
        "batch": size["batch"],
        "seq": size["seq"],
        "tokens": steps * size["batch"] * size["seq"],
        "loss_first": sum(first) / len(first),
        "loss_last": sum(last) / len(last),
        "seconds": round(time.time() - t, 1),
    }


def save(model, tok, out: Path) -> None:
    """The checkpoint in bf16 (safetensors, ``config.json``) and the tokenizer beside it."""
    import torch
    from transformers import PreTrainedTokenizerFast

    model.to(torch.bfloat16).save_pretrained(out)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT).save_pretrained(out)


def build(out: Path, size_name: str = "full", device: str = "cuda", seed: int = 0, steps: int | None = None) -> dict:
    """Corpus, tokenizer, training (``steps``: the size's unless given), held-out loss,
    checkpoint and prompts under ``out``; returns the figures (also written to
    ``out/verifier.json``). Reuses a finished ``out``."""
    done = out / "verifier.json"
    if done.is_file():
        return json.loads(done.read_text())
    import torch

    size = {**SIZES[size_name], **({"steps": steps} if steps else {})}
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.time()
    files, about = corpus(size["corpus_bytes"])
    texts = {name: [text for rel, text in files if side(rel) == name] for name in ("verifier", "user", "heldout")}
    train_texts, heldout_texts = texts["verifier"], texts["heldout"]
    about["heldout_files"], about["user_files"] = len(heldout_texts), len(texts["user"])
    log(f"corpus: {about['name']}, {about['files']} files, {about['bytes']:,} bytes, sha256 {about['sha256']}")
    log(
        f"held out: {len(heldout_texts)} files ({HELD_OUT_PERCENT} % by path hash); the user's text (the draft's "
        f"prompts): {len(texts['user'])} files ({USER_PERCENT} %); the verifier trains on the other {len(train_texts)}"
    )
    tok = train_tokenizer(train_texts, size["vocab"])
    train_stream, heldout_stream = token_stream(tok, train_texts), token_stream(tok, heldout_texts)
    user_stream = token_stream(tok, texts["user"])
    tokenizer_sha = hashlib.sha256(tok.to_str().encode()).hexdigest()
    log(
        f"tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens (sha256 {tokenizer_sha[:16]}); "
        f"{len(train_stream):,} training tokens, {len(heldout_stream):,} held-out tokens"
    )
    prep = round(time.time() - t0, 1)
    model, training = train(train_stream, size, device, seed)
    heldout = evaluate(model, heldout_stream, size, device)
    trained_on = evaluate(model, train_stream, size, device)
    log(
        f"trained {training['steps']} steps ({training['tokens']:,} tokens, {training['seconds']} s): "
        f"loss {training['loss_first']:.3f} -> {training['loss_last']:.3f}"
    )
    log(
        f"held-out loss {heldout['loss']:.4f} nats/token (perplexity {math.exp(heldout['loss']):.2f}, "
        f"top-1 {heldout['top1']:.3f}) on {heldout['tokens']:,} tokens; training files {trained_on['loss']:.4f}"
    )
    out.mkdir(parents=True, exist_ok=True)
    save(model, tok, out)
    starts_user, starts_held = line_starts(tok, user_stream), line_starts(tok, heldout_stream)
    sets = {
        "train": prompts(user_stream, starts_user, size["train_prompts"], PROMPT_TOKENS, seed + 1),
        "heldout": prompts(heldout_stream, starts_held, size["heldout_prompts"], PROMPT_TOKENS, seed + 2),
    }
    (out / "prompts.json").write_text(json.dumps(sets))
    figures = {
        "size": size_name,
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "corpus": about,
        "tokenizer": {"kind": "byte-level BPE", "vocab": tok.get_vocab_size(), "sha256": tokenizer_sha},
        "tokens": {"train": len(train_stream), "user": len(user_stream), "heldout": len(heldout_stream)},
        "model": {k: size[k] for k in ("vocab", "hidden", "layers", "heads", "intermediate")}
        | {"parameters": sum(p.numel() for p in model.parameters())},
        "training": training,
        "heldout": heldout,
        "train_files_eval": trained_on,
        "prompts": {k: len(v) for k, v in sets.items()} | {"tokens": PROMPT_TOKENS},
        "seconds": {"corpus_and_tokenizer": prep, "total": round(time.time() - t0, 1)},
        "versions": _versions(),
    }
    done.write_text(json.dumps(figures, indent=1))
    return figures


def _versions() -> dict:
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for dist in ("torch", "transformers", "tokenizers"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for the checkpoint, tokenizer and prompts")
    parser.add_argument("--tiny", action="store_true", help="the CPU-sized run (SIZES['tiny'])")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when torch sees one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the size's)")
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    figures = build(Path(args.out), "tiny" if args.tiny else "full", device, args.seed, args.steps)
    print(MARKER + json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

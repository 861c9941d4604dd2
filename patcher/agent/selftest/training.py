"""selftest's training stage: speculators' own EAGLE-3 trainer on the hidden states just captured.

Runs under the target's interpreter after the extraction check of one architecture, on that
check's captures (first, middle and last layer of the tiny verifier, every case but the repeated
one). Everything is speculators' public training code as its ``scripts/train.py`` drives it,
on the installed (patched) release:

1. the captures saved as the generator's data files (``{"input_ids", "hidden_states", "loss_mask"}``,
   ``hidden_states`` = the three layers plus the last again as the verifier's last hidden state),
   read back by ``speculators.train.data.Eagle3SampleFileDataset`` and packed by its
   ``create_collate_fn`` into 512-token batches;
2. the vocabulary mapping (``build_vocab_mappings_from_distribution``, 256 draft tokens), the
   draft's config (``Eagle3SpeculatorConfig`` over a one-layer ``LlamaConfig`` of the verifier's
   widths, as ``scripts/train.py`` builds it) and the draft (``Eagle3DraftModel``);
3. GPU: speculators' ``Trainer`` (forward, backward and AdamW steps through its compiled
   forward, its ``SingleGPUCheckpointer`` saving each epoch); CPU (FlexAttention has no backward
   there): the forward and its loss, then the checkpointer's save;
4. the saved checkpoint reloaded the way the trainer resumes (``SpeculatorModelConfig.from_pretrained``,
   a new ``Eagle3DraftModel``, the checkpointer's state-dict load): its weights must be the saved
   ones exactly (bf16, as the checkpointer writes them);
5. the reference: ``eagle3_reference`` (plain torch, written from the algorithm) runs the same
   forward and loss on the same weights and batch. The per-step losses must agree within
   ``LOSS_TOLERANCE`` (relative) and the draft tokens of each step within ``TOKEN_AGREEMENT``;
   on the GPU the loss on a fixed batch must also be lower after training than before.

Any exception is reported with the stage it happened in, for the controller to name the patch.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

SEQ_LEN = 512  # packed batch length: a multiple of FlexAttention's 128-token blocks
DRAFT_VOCAB = 256
TTT_STEPS = 3
EPOCHS = 3  # GPU: about 20 batches an epoch
LEARNING_RATE = 1e-3
LOSS_TOLERANCE = 1e-3  # relative, per TTT step: speculators' loss vs the plain-torch reference
TOKEN_AGREEMENT = 0.99  # share of draft tokens per TTT step both implementations pick alike
SKIP_CASES = ("order-again",)  # the repeated batch adds no new data


class StageError(Exception):
    """A stage of the training check failed; ``stage`` names it, the cause is chained."""

    def __init__(self, stage: str) -> None:
        super().__init__(stage)
        self.stage = stage


def _stage(name: str):
    """Decorator: an exception inside becomes ``StageError(name)`` (cause chained)."""

    def wrap(fn):
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except StageError:
                raise
            except Exception as exc:
                raise StageError(name) from exc

        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        return run

    return wrap


@_stage("data files")
def write_data(outputs: dict, datadir: Path) -> list[str]:
    """The captures as the generator's data files, one ``.pt`` per prompt (prompts of one token
    skipped: training shifts each sequence by one). Returns their paths."""
    import torch

    datadir.mkdir(parents=True, exist_ok=True)
    files = []
    for name, (_, results) in outputs.items():
        if name in SKIP_CASES:
            continue
        for i, result in enumerate(results):
            ids = result["input_ids"]
            if len(ids) < 2:
                continue
            states = [h.contiguous() for h in result["hidden_states"]]
            path = datadir / f"{name}-{i}.pt"
            torch.save(
                {"input_ids": ids, "hidden_states": [*states, states[-1]], "loss_mask": torch.ones_like(ids)}, path
            )
            files.append(str(path))
    return files


@_stage("vocabulary mapping")
def vocab_mapping(files: list[str], vocab_size: int):
    """(d2t, t2d) from the token frequencies of the data (speculators' own mapping)."""
    from collections import Counter

    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq: Counter = Counter()
    for f in files:
        freq.update(torch.load(f, weights_only=True)["input_ids"].tolist())
    return build_vocab_mappings_from_distribution(dict(freq), DRAFT_VOCAB, vocab_size)


@_stage("draft config")
def draft_config(model_dir: Path, text_config: dict):
    """``Eagle3SpeculatorConfig`` over a one-layer Llama of the verifier's widths (its text
    model's: ``text_config``, the whole config but for a vision-language wrapper, Kimi-K2.5),
    naming the verifier as its checkpoint does (``architectures`` of its ``config.json``)."""
    import json

    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    heads = text_config["num_attention_heads"]
    layer = LlamaConfig(
        vocab_size=text_config["vocab_size"],
        hidden_size=text_config["hidden_size"],
        intermediate_size=text_config["intermediate_size"],
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=text_config.get("num_key_value_heads") or heads,
        max_position_embeddings=text_config.get("max_position_embeddings", 2048),
        rms_norm_eps=text_config.get("rms_norm_eps", 1e-6),
        head_dim=text_config.get("head_dim") or text_config["hidden_size"] // heads,
    )
    layer._attn_implementation = "simple_flex_attention"  # as speculators' scripts/train.py sets it
    return Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=TTT_STEPS)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(
                name_or_path=str(model_dir),
                architectures=json.loads((model_dir / "config.json").read_text())["architectures"],
            ),
        ),
    )


@_stage("draft model")
def draft_model(config, d2t, t2d):
    from speculators.models.eagle3 import Eagle3DraftModel

    return Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t)


@_stage("dataset")
def loader(files: list[str]):
    """speculators' dataset, packing sampler and collate function over ``files``."""
    import torch
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    dataset = Eagle3SampleFileDataset(max_len=SEQ_LEN, file_list=files, hidden_states_dtype=torch.float32)
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=SEQ_LEN, lengths=dataset.approx_lengths, num_replicas=1, rank=0
    )
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=create_collate_fn(SEQ_LEN))


def _shape(config, text_config: dict) -> dict:
    layer = config.transformer_layer_config
    return {
        "verifier_eps": text_config.get("rms_norm_eps", 1e-6),
        "layers": layer.num_hidden_layers,
        "heads": layer.num_attention_heads,
        "kv_heads": layer.num_key_value_heads,
        "head_dim": layer.head_dim,
        "eps": layer.rms_norm_eps,
        "rope_theta": _rope_theta(layer),
        "norm_before_residual": config.norm_before_residual,
    }


def _rope_theta(layer) -> float:
    """The rotary base of a LlamaConfig: ``rope_theta`` (transformers 4) or
    ``rope_parameters["rope_theta"]`` (5); only the default rope is built here."""
    params = getattr(layer, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default") if isinstance(params, dict) else "default"
    if rope_type != "default":
        raise ValueError(f"the reference implements the default rope only, not {rope_type}")
    return float(params.get("rope_theta") or getattr(layer, "rope_theta", 10000.0))


@_stage("training forward")
def speculators_loss(model, batch: dict) -> tuple[float, list[float], list]:
    """The loss, per-step losses and draft tokens of speculators' own (compiled) forward."""
    import torch

    model.eval()
    with torch.no_grad(), _stance(batch["input_ids"].device.type):
        tokens, loss, metrics = model(**batch, ttt_steps=TTT_STEPS)
    return loss.item(), [metrics[f"loss_{s}"].item() for s in range(TTT_STEPS)], tokens


@_stage("reference check")
def reference_check(model, batch: dict, config, text_config: dict) -> dict:
    """speculators' loss against ``eagle3_reference`` on the same weights and batch."""
    import torch

    from . import eagle3_reference  # torch at import: only on the target

    with _full_fp32():
        total, steps, tokens = speculators_loss(model, batch)
        weights = {k: v.float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
        with torch.no_grad():
            ref = eagle3_reference.forward(weights, batch, _shape(config, text_config), TTT_STEPS, given_tokens=tokens)
    agreement = [float((a[0] == b).float().mean()) for a, b in zip(tokens, ref["tokens"])]
    worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(steps, ref["step_losses"]))
    return {
        "speculators_loss": round(total, 7),
        "reference_loss": round(ref["loss"].item(), 7),
        "step_losses": [round(x, 7) for x in steps],
        "reference_step_losses": [round(x, 7) for x in ref["step_losses"]],
        "worst_relative_difference": worst,
        "token_agreement": [round(a, 5) for a in agreement],
        "ok": worst <= LOSS_TOLERANCE and min(agreement) >= TOKEN_AGREEMENT,
    }


class _full_fp32:
    """Both implementations in full fp32 while they are compared: no TF32 matrix products
    (``torch.set_float32_matmul_precision``, which a GPU job may have lowered), restored after."""

    def __enter__(self) -> None:
        import torch

        self.before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc) -> None:
        import torch

        torch.set_float32_matmul_precision(self.before)


def _stance(device: str):
    """On the CPU, where nothing trains, the forward runs eagerly (``torch.compiler.set_stance``,
    torch >= 2.6): compiling it there costs about 25 s a model and proves nothing the GPU run of
    the trainer does not. Elsewhere: the compiled forward, as the trainer runs it."""
    import contextlib

    import torch

    if device == "cpu" and hasattr(torch.compiler, "set_stance"):
        return torch.compiler.set_stance("force_eager")
    return contextlib.nullcontext()


def _on(batch: dict, device: str) -> dict:
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}


@_stage("trainer")
def train_on_gpu(model, train_loader, save_path: Path, steps_seen: list) -> None:
    """speculators' ``Trainer``: ``EPOCHS`` epochs of forward, backward and AdamW steps, a
    checkpoint saved after each; every step's logged loss goes to ``steps_seen``."""
    import logging

    from speculators.train.trainer import Trainer, TrainerConfig

    class Losses(logging.Handler):
        def emit(self, record):
            msg = record.msg
            if isinstance(msg, dict) and "train" in msg:
                steps_seen.append(msg["train"]["loss"])

    handler = Losses()
    metrics = logging.getLogger("speculators.metrics")
    metrics.addHandler(handler)
    metrics.setLevel(logging.INFO)
    try:
        kwargs = {"ttt_steps": TTT_STEPS}
        config = TrainerConfig(
            lr=LEARNING_RATE,
            num_epochs=EPOCHS,
            save_path=str(save_path),
            train_call_kwargs=kwargs,
            val_call_kwargs=kwargs,
        )
        Trainer(model, config, train_loader, None).run_training()
    finally:
        metrics.removeHandler(handler)


@_stage("checkpoint save")
def save_untrained(model, where: Path) -> Path:
    """``model`` as built, before any optimizer step, saved by speculators' checkpointer as
    epoch 0 under ``where``; returns that epoch's directory."""
    import torch
    from speculators.train.checkpointer import SingleGPUCheckpointer

    SingleGPUCheckpointer(where).save_checkpoint(model, torch.optim.AdamW(model.parameters()), 0)
    return where / "0"


@_stage("checkpoint save")
def save_on_cpu(model, save_path: Path) -> None:
    """What the trainer does at the end of an epoch, without the optimizer steps the CPU
    cannot take: its checkpointer saves the draft (bf16) and an AdamW state."""
    import torch
    from speculators.train.checkpointer import SingleGPUCheckpointer

    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    SingleGPUCheckpointer(save_path).save_checkpoint(model, optimizer, 0)


@_stage("checkpoint reload")
def reload(save_path: Path, d2t, t2d, device: str):
    """The newest checkpoint as the trainer resumes one: config, a new draft, the state dict
    (``SingleGPUCheckpointer.load_model_state_dict`` on a GPU; on the CPU the same steps with
    the checkpointer's own helpers, since it loads to ``cuda:0``). Returns (draft, epoch dir)."""
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train import checkpointer as ck

    saved = ck.SingleGPUCheckpointer(save_path)
    if saved.previous_epoch < 0:
        raise FileNotFoundError(f"no checkpoint under {save_path}")
    config = SpeculatorModelConfig.from_pretrained(str(saved.prev_path))
    config.transformer_layer_config._attn_implementation = "simple_flex_attention"
    model = Eagle3DraftModel(config=config, t2d=t2d.cpu(), d2t=d2t.cpu()).to(device)
    if device == "cuda":
        saved.load_model_state_dict(model)
    else:
        state = ck.convert_float_dtype(
            ck.load_safetensors_state_dict(saved.model_path(saved.previous_epoch), "cpu"), model.dtype
        )
        model.load_state_dict(state, strict=False)
    return model, saved.prev_path


def _bf16_equal(trained: dict, reloaded: dict) -> list[str]:
    """Names of the saved tensors whose reloaded value differs from the trained one rounded
    to bf16 (the checkpointer's dtype); [] when every one is as saved."""
    import torch

    bad = []
    for name, value in trained.items():
        if name == "verifier_lm_head.weight":  # not saved: rebuilt from the verifier
            continue
        want = value.to(torch.bfloat16).to(value.dtype) if value.is_floating_point() else value
        got = reloaded.get(name)
        if got is None or got.shape != want.shape or not torch.equal(got.to(want.device), want):
            bad.append(name)
    return bad


def run(
    outputs: dict, model_dir: Path, text_config: dict, device: str, workdir: Path, progress, on_untrained=None
) -> dict:
    """The whole training check for one architecture; a JSON-ready dict (``ok``, figures,
    or ``error`` with the ``stage`` that failed). On a GPU the draft's untrained weights are
    saved first (``workdir/untrained``, by speculators' checkpointer) and, before anything
    trains, their epoch directory is handed to ``on_untrained`` (selftest's serving starts
    that draft's engine while training runs)."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # the trainer's progress bars, not in the report's stream
    report: dict = {"device": device, "seconds": {}}
    t0 = time.time()
    try:
        _run(outputs, model_dir, text_config, device, workdir, progress, report, on_untrained)
    except StageError as exc:
        cause = exc.__cause__ or exc
        tb = traceback.format_exception(type(cause), cause, cause.__traceback__)
        report["error"] = {
            "stage": exc.stage,
            "type": type(cause).__name__,
            "message": str(cause).strip(),
            "traceback": "".join(tb)[-4000:],
        }
    report["seconds"]["total"] = round(time.time() - t0, 1)
    required = ("before", "reload", "after") + (("trained",) if device == "cuda" else ())
    report["ok"] = "error" not in report and all(report.get(k, {}).get("ok") for k in required)
    return report


def _run(outputs, model_dir, text_config, device, workdir, progress, report, on_untrained) -> None:
    import torch

    files = write_data(outputs, workdir / "data")
    d2t, t2d = vocab_mapping(files, text_config["vocab_size"])
    config = draft_config(model_dir, text_config)
    torch.manual_seed(0)
    model = draft_model(config, d2t, t2d).to(device)
    if device == "cuda" and on_untrained is not None:
        on_untrained(save_untrained(model, workdir / "untrained"))
    batches = loader(files)
    fixed = _on(next(iter(batches)), device)
    report.update(samples=len(files), draft={"layers": 1, "draft_vocab": DRAFT_VOCAB, "ttt_steps": TTT_STEPS})
    progress(f"training: {len(files)} captured sequences, draft {DRAFT_VOCAB} tokens, {TTT_STEPS} TTT steps, {device}")
    report["before"] = reference_check(model, fixed, config, text_config)
    save_path = workdir / "draft"
    t = time.time()
    if device == "cuda":
        seen: list = []
        train_on_gpu(model, batches, save_path, seen)
        report["trained"] = _trained(seen, report["before"]["speculators_loss"], speculators_loss(model, fixed)[0])
        progress(
            f"training: {len(seen)} optimizer steps, loss {seen[0]:.4f} -> {seen[-1]:.4f}"
            if seen
            else "training: no steps"
        )
    else:
        save_on_cpu(model, save_path)
    report["seconds"]["train"] = round(time.time() - t, 1)
    reloaded, where = reload(save_path, d2t, t2d, device)
    differ = _bf16_equal(model.state_dict(), reloaded.state_dict())
    report["reload"] = {"checkpoint": Path(where).name, "tensors_differing": differ, "ok": not differ}
    report["after"] = reference_check(reloaded, fixed, config, text_config)
    progress(
        f"training: reloaded checkpoint {Path(where).name}: loss {report['after']['speculators_loss']:.6f}, "
        f"plain-torch reference {report['after']['reference_loss']:.6f}"
    )


def _trained(steps: list, before: float, after: float) -> dict:
    """The trainer's logged loss per step and the fixed batch's loss before and after
    training; ``ok`` when steps ran and the fixed batch's loss went down."""
    return {
        "steps": len(steps),
        "first_step_loss": round(steps[0], 6) if steps else None,
        "last_step_loss": round(steps[-1], 6) if steps else None,
        "fixed_batch_loss_before": round(before, 6),
        "fixed_batch_loss_after": round(after, 6),
        "ok": bool(steps) and after < before,
    }

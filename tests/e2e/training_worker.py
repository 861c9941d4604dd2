"""Runs under a target's Python (torch, transformers, the installed speculators): speculators'
EAGLE-3 draft built, run and saved the way its ``scripts/train.py`` does, on fixed weights and data.

    python training_worker.py WORKDIR OUT.json [--kimi]

Every weight comes from one seeded generator (not from a library's initialiser, which may
change between releases), so the loss depends only on the computation: the same figure on
transformers 4.57.6 and 5.22.2 is the proof that the patched config builds the same draft.
Writes {"loss", "step_losses", "reloaded_loss", "reloaded_config", "transformers", "torch"},
or {"error", "stage"} where a step raised.

``--kimi`` adds ``"kimi"``: selftest's training stage (patcher/agent/selftest/training.py, the
code selftest ships) for the tiny Kimi-K2.5 verifier (the wrapper, MLA, MoE, ``language_model.``
names: selftest's kimi_k25.py), on captures of its first, middle and last decoder layers taken
from transformers' DeepSeek-V3 forward of the same weights (bf16, as vLLM captures them): no vLLM
needed, so it runs in a training-only env. The draft's embedding and masked head must be the
checkpoint's ``language_model.`` tensors; its loss must match the plain-torch reference before
and after the checkpointer's save and reload. ``"layouts"``: the same embedding and head stored
as other wrapped verifiers store them (sharded with an index, transformers' module layout, a tied
head), each found by the draft.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

HIDDEN, HEADS, HEAD_DIM, VOCAB, DRAFT_VOCAB, TOKENS = 128, 2, 64, 512, 256, 256
LENGTHS = (100, 60, 70)  # three packed sequences and 26 tokens of padding


def fill(module, generator, skip=()) -> None:
    """Every floating parameter of ``module`` (but ``skip``) from ``generator``, std 0.05."""
    import torch

    with torch.no_grad():
        for name, param in sorted(module.named_parameters()):
            if name not in skip:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)


def verifier(path: Path, generator) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    fill(model, generator)
    model.save_pretrained(path)


def draft(verifier_path: Path, generator):
    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layer = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
    )
    layer._attn_implementation = "simple_flex_attention"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(verifier_path), architectures=["LlamaForCausalLM"]),
        ),
    )
    keep = torch.randperm(VOCAB, generator=generator)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[keep] = True
    d2t = keep - torch.arange(DRAFT_VOCAB)
    model = Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t)
    fill(model, generator, skip=("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight"))
    return model, t2d, d2t


def batch(generator) -> dict:
    import torch

    used = sum(LENGTHS)
    positions = [torch.arange(1, n + 1) for n in LENGTHS] + [torch.zeros(TOKENS - used, dtype=torch.long)]
    return {
        "hidden_states": torch.randn(1, TOKENS, 3 * HIDDEN, generator=generator),
        "input_ids": torch.randint(0, VOCAB, (1, TOKENS), generator=generator),
        "lengths": torch.tensor(LENGTHS),
        "loss_mask": (torch.rand(1, TOKENS, generator=generator) > 0.3).long(),
        "position_ids": torch.cat(positions).unsqueeze(0),
        "verifier_last_hidden_states": torch.randn(1, TOKENS, HIDDEN, generator=generator),
    }


def loss(model, data: dict) -> tuple[float, list[float]]:
    """speculators' training forward (eagerly: the CPU compiles it for no benefit here)."""
    import torch

    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        _, total, metrics = model(**data, ttt_steps=3)
    return total.item(), [metrics[f"loss_{s}"].item() for s in range(3)]


def main(workdir: Path, out: Path) -> None:
    import torch
    import transformers

    report = {"transformers": transformers.__version__, "torch": torch.__version__}
    stage = "verifier"
    try:
        generator = torch.Generator().manual_seed(0)
        verifier(workdir / "verifier", generator)
        stage = "draft"
        model, t2d, d2t = draft(workdir / "verifier", generator)
        data = batch(generator)
        stage = "training forward"
        report["loss"], report["step_losses"] = loss(model, data)
        stage = "checkpoint save"
        from speculators import SpeculatorModelConfig
        from speculators.models.eagle3 import Eagle3DraftModel
        from speculators.train import checkpointer as ck

        saved = ck.SingleGPUCheckpointer(workdir / "checkpoints")
        saved.save_checkpoint(model, torch.optim.AdamW(model.parameters()), 0)
        stage = "checkpoint reload"
        config = SpeculatorModelConfig.from_pretrained(str(workdir / "checkpoints" / "0"))
        config.transformer_layer_config._attn_implementation = "simple_flex_attention"
        again = Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t)
        state = ck.load_safetensors_state_dict(saved.model_path(0), "cpu")
        again.load_state_dict(ck.convert_float_dtype(state, torch.float32), strict=False)
        report["reloaded_config"] = type(config).__name__
        report["reloaded_loss"] = loss(again, data)[0]
    except Exception as exc:
        report.update(stage=stage, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
    out.write_text(json.dumps(report))


KIMI_CASES = ("order", "over-max-seqs")  # 54 prompts of 1-300 tokens: four packed 512-token batches


def kimi(workdir: Path) -> dict:
    """selftest's training stage for the tiny Kimi-K2.5 on captures taken with transformers."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from patcher.agent.selftest import cases, kimi_k25, tiny_models, training

    model_dir = workdir / "kimi_k25"
    text_config = tiny_models.build("kimi_k25", model_dir)
    layers = cases.layer_ids(text_config["num_hidden_layers"])
    reference = kimi_k25.load_reference(model_dir, torch.bfloat16)
    seen: dict = {}
    for i in layers:
        reference.model.layers[i].register_forward_hook(
            lambda _m, _a, out, i=i: seen.__setitem__(i, (out[0] if isinstance(out, tuple) else out)[0])
        )
    outputs = {}
    with torch.no_grad():
        for case in KIMI_CASES:
            batch = cases.prompts(case, text_config["vocab_size"])
            results = []
            for ids in batch:
                reference(torch.tensor([ids]))
                results.append({"input_ids": torch.tensor(ids), "hidden_states": [seen[i].clone() for i in layers]})
            outputs[case] = (batch, results)
    report = training.run(outputs, model_dir, text_config, "cpu", workdir / "kimi-training", lambda _line: None)
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel

    if "error" not in report:  # the draft's embedding and head are the wrapped verifier's own tensors
        stored = load_file(str(model_dir / "model.safetensors"))
        config = training.draft_config(model_dir, text_config)
        t2d = torch.zeros(text_config["vocab_size"], dtype=torch.bool)
        t2d[: training.DRAFT_VOCAB] = True
        draft = Eagle3DraftModel(config=config, t2d=t2d, d2t=torch.zeros(training.DRAFT_VOCAB, dtype=torch.long))
        embed = stored["language_model.model.embed_tokens.weight"].to(draft.embed_tokens.weight.dtype)
        head = stored["language_model.lm_head.weight"].to(draft.lm_head.weight.dtype)[: training.DRAFT_VOCAB]
        report["embedding_is_the_verifiers"] = torch.equal(draft.embed_tokens.weight, embed)
        report["head_is_the_verifiers"] = torch.equal(draft.verifier_lm_head.weight, head)
        report["verifier_architectures"] = config.speculators_config.verifier.architectures
        report["layouts"] = layouts(model_dir, workdir / "layouts", text_config, stored)
    return report


# Where a checkpoint keeps its text model's embedding and head (SP034's three layouts), each
# written as its own verifier: (embedding name, head name or None for a tied head, sharded).
LAYOUTS = {
    "wrapper, sharded with an index (Kimi-K2.5, Llama-4, Gemma-3 as published)": (
        "language_model.model.embed_tokens.weight",
        "language_model.lm_head.weight",
        True,
    ),
    "transformers module layout (Qwen3-VL)": ("model.language_model.embed_tokens.weight", "lm_head.weight", False),
    "wrapper, tied head": ("language_model.model.embed_tokens.weight", None, False),
}


def layouts(model_dir: Path, root: Path, text_config: dict, stored: dict) -> dict:
    """For each of ``LAYOUTS``: the tiny Kimi-K2.5's config with its embedding and head (other
    tensors left out) stored under those names; whether the draft built from it holds exactly
    that embedding and that head's rows (the embedding's, for a tied head)."""
    import shutil

    import torch
    from safetensors.torch import save_file
    from speculators.models.eagle3 import Eagle3DraftModel

    from patcher.agent.selftest import training

    embed = stored["language_model.model.embed_tokens.weight"]
    head = stored["language_model.lm_head.weight"]
    t2d = torch.zeros(text_config["vocab_size"], dtype=torch.bool)
    t2d[1 : 2 * training.DRAFT_VOCAB : 2] = True  # every other token: rows the head must pick by t2d
    found = {}
    for name, (embed_key, head_key, sharded) in LAYOUTS.items():
        dest = root / str(len(found))
        dest.mkdir(parents=True)
        for f in model_dir.iterdir():
            if f.suffix in (".json", ".py") and f.name != "model.safetensors.index.json":
                shutil.copy(f, dest / f.name)
        tensors = {embed_key: embed, **({head_key: head} if head_key else {})}
        if sharded:
            shards = {key: f"model-{i + 1:05d}-of-{len(tensors):05d}.safetensors" for i, key in enumerate(tensors)}
            for key, shard in shards.items():
                save_file({key: tensors[key]}, str(dest / shard), metadata={"format": "pt"})
            (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": shards}))
        else:
            save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
        draft = Eagle3DraftModel(
            config=training.draft_config(dest, text_config),
            t2d=t2d,
            d2t=torch.zeros(training.DRAFT_VOCAB, dtype=torch.long),
        )
        want_head = (head if head_key else embed).to(draft.verifier_lm_head.weight.dtype)[t2d]
        found[name] = torch.equal(draft.embed_tokens.weight, embed.to(draft.embed_tokens.weight.dtype)) and torch.equal(
            draft.verifier_lm_head.weight, want_head
        )
    return found


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    if "--kimi" in sys.argv[3:]:
        out = Path(sys.argv[2])
        found = json.loads(out.read_text())
        try:
            found["kimi"] = kimi(Path(sys.argv[1]))
        except Exception as exc:
            found["kimi"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        out.write_text(json.dumps(found))

"""Runs under a target's Python (torch, transformers, the installed speculators): speculators'
EAGLE-3 draft built, run and saved the way its ``scripts/train.py`` does, on fixed weights and data.

    python training_worker.py WORKDIR OUT.json

Every weight comes from one seeded generator (not from a library's initialiser, which may
change between releases), so the loss depends only on the computation: the same figure on
transformers 4.57.6 and 5.22.2 is the proof that the patched config builds the same draft.
Writes {"loss", "step_losses", "reloaded_loss", "reloaded_config", "transformers", "torch"},
or {"error", "stage"} where a step raised.
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


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

"""Checkpoint tensors as transformers and vLLM each name and hold them: the experts of a
MoE layer fused or one by one, DeepSeek's router bias in fp32, and a load that takes every
tensor from the checkpoint. Shared by ``tiny_models`` and ``kimi_k25`` (under the target's
interpreter; torch is imported on first use)."""

from __future__ import annotations

FUSED_GATE_UP, FUSED_DOWN = "mlp.experts.gate_up_proj", "mlp.experts.down_proj"


def unfuse_experts(state: dict) -> dict:
    """The state with each MoE layer's experts named one by one, as checkpoints (and vLLM's
    loader) name them: ``…mlp.experts.{e}.gate_proj.weight`` / ``up_proj.weight`` [I, H] and
    ``down_proj.weight`` [H, I]. transformers 5 holds them fused: ``…mlp.experts.gate_up_proj``
    [E, 2I, H] (gate rows first; ``DeepseekV3NaiveMoe.forward`` chunks ``linear(x, w[e])`` in
    two) and ``…mlp.experts.down_proj`` [E, H, I]. Other keys, and transformers 4 states
    (already per expert), are returned unchanged."""
    out = {}
    for key, value in state.items():
        if key.endswith(FUSED_GATE_UP):
            stem = key[: -len("gate_up_proj")]
            gate, up = value.chunk(2, dim=1)
            for e in range(value.shape[0]):
                out[f"{stem}{e}.gate_proj.weight"] = gate[e].contiguous()
                out[f"{stem}{e}.up_proj.weight"] = up[e].contiguous()
        elif key.endswith(FUSED_DOWN):
            stem = key[: -len("down_proj")]
            for e in range(value.shape[0]):
                out[f"{stem}{e}.down_proj.weight"] = value[e].contiguous()
        else:
            out[key] = value
    return out


def fuse_experts(state: dict, wanted: set) -> dict:
    """The inverse of ``unfuse_experts`` for the fused keys a model has (``wanted``: its
    ``state_dict()`` keys); per-expert keys are stacked back in expert order."""
    import torch

    out = dict(state)
    for key in wanted:
        if key.endswith(FUSED_GATE_UP):
            stem = key[: -len("gate_up_proj")]
            n = sum(1 for k in state if k.startswith(stem) and k.endswith(".gate_proj.weight"))
            out[key] = torch.stack(
                [
                    torch.cat([out.pop(f"{stem}{e}.gate_proj.weight"), out.pop(f"{stem}{e}.up_proj.weight")])
                    for e in range(n)
                ]
            )
        elif key.endswith(FUSED_DOWN):
            stem = key[: -len("down_proj")]
            n = sum(1 for k in state if k.startswith(stem) and k.endswith(".down_proj.weight"))
            out[key] = torch.stack([out.pop(f"{stem}{e}.down_proj.weight") for e in range(n)])
    return out


def router_bias_as_vllm(model, state: dict, device: str):
    """``model`` with DeepSeek's router bias back in fp32 from ``state``: ``.to(dtype)`` casts
    buffers, vLLM keeps ``e_score_correction_bias`` in fp32. Returns ``model``."""
    import torch

    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias") and name in state:
            buf.data = state[name].to(device=device, dtype=torch.float32)
    return model


def load_exactly(model, state: dict, where) -> None:
    """Load checkpoint-format ``state`` into ``model`` (fusing experts where the model wants
    them fused). Raises ``ValueError`` naming the first differing keys unless every tensor
    matches one of the model's (tied ``lm_head.weight`` may be absent)."""
    wanted = set(model.state_dict())
    missing, unexpected = model.load_state_dict(fuse_experts(state, wanted), strict=False)
    missing = [
        k for k in missing if not (k == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False))
    ]
    if missing or unexpected:
        raise ValueError(
            f"{where}: checkpoint tensors do not match {type(model).__name__} "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
        )

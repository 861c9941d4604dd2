"""An independent EAGLE-3 training forward and loss in plain torch (no transformers, no speculators).

What speculators 0.3.0's ``Eagle3DraftModel.forward`` computes (speculators/models/eagle3/core.py),
written from the algorithm rather than from its code: ``fc`` maps the three captured verifier layers
to one hidden state; each test-time-training (TTT) step feeds ``[embed(token), hidden]`` through the
draft's decoder layers (the first one normalises both halves and attends from ``2 * hidden``), with
attention over the packed sequences (causal, within each sequence) plus, for the keys of earlier TTT
steps, only the same position; the loss of step ``s`` is the KL divergence from the verifier's
distribution ``softmax(verifier_lm_head(last hidden))`` (0.4: of the verifier's final norm of it)
to the draft's, over positions shifted by
``s``, weighted by the loss mask. The next step's token is the draft's own argmax mapped to the
verifier's vocabulary with ``d2t``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm over the last dimension, computed in fp32, returned in ``x``'s dtype."""
    x32 = x.float()
    out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * out.to(x.dtype)


def rotary(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of rotary position embeddings: [tokens, head_dim] each (the two halves repeat)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [heads, tokens, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def allowed(document: torch.Tensor, steps: int) -> torch.Tensor:
    """Which keys each query may attend to at TTT step ``steps - 1``: [tokens, steps * tokens].

    ``document``: the packed sequence each position belongs to, -1 for padding. Keys of the
    first block: causal and same sequence (padding queries see none); keys of later blocks
    (the cache of earlier steps): the same position only, for every query."""
    n = document.shape[0]
    q = torch.arange(n, device=document.device)[:, None]
    k = torch.arange(n, device=document.device)[None, :]
    first = (q >= k) & (document[q] != -1) & (document[q] == document[k])
    first = first | (q == k)
    later = (q == k).expand(n, n)
    return torch.cat([first] + [later] * (steps - 1), dim=1)


class Layer:
    """One draft decoder layer's weights (names as in the draft's state dict, prefix stripped)."""

    def __init__(self, weights: dict, prefix: str, heads: int, kv_heads: int, head_dim: int, eps: float) -> None:
        self.w = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps

    def attention(self, x, cos, sin, cache, mask):
        """x: [tokens, in]; cache: list of (k, v) of earlier steps for this layer, extended here."""
        w, n = self.w, x.shape[0]
        q = (x @ w["self_attn.q_proj.weight"].T).view(n, self.heads, self.head_dim).transpose(0, 1)
        k = (x @ w["self_attn.k_proj.weight"].T).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        v = (x @ w["self_attn.v_proj.weight"].T).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        cache.append((k, v))
        keys = torch.cat([c[0] for c in cache], dim=1)
        values = torch.cat([c[1] for c in cache], dim=1)
        group = self.heads // self.kv_heads
        keys, values = keys.repeat_interleave(group, dim=0), values.repeat_interleave(group, dim=0)
        scores = (q @ keys.transpose(1, 2)) * self.head_dim**-0.5
        scores = scores.masked_fill(~mask[None], float("-inf"))
        out = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ values
        return out.transpose(0, 1).reshape(n, self.heads * self.head_dim) @ w["self_attn.o_proj.weight"].T

    def mlp(self, x):
        w = self.w
        gate = F.silu(x @ w["mlp.gate_proj.weight"].T)
        return (gate * (x @ w["mlp.up_proj.weight"].T)) @ w["mlp.down_proj.weight"].T

    def forward(self, x, cos, sin, cache, mask, first: bool, norm_before_residual: bool):
        w, eps = self.w, self.eps
        if first:
            embeds, hidden = x.chunk(2, dim=-1)
            normed = rms_norm(hidden, w["hidden_norm.weight"], eps)
            residual = normed if norm_before_residual else hidden
            x = torch.cat([rms_norm(embeds, w["input_layernorm.weight"], eps), normed], dim=-1)
        else:
            residual = x
            x = rms_norm(x, w["input_layernorm.weight"], eps)
        h = residual + self.attention(x, cos, sin, cache, mask)
        return h + self.mlp(rms_norm(h, w["post_attention_layernorm.weight"], eps))


def kl_loss(logits, targets, loss_mask):
    """Mean over sequences of sum_positions KL(softmax(targets) || softmax(logits)) * mask / sum(mask)."""
    kl = F.kl_div(F.log_softmax(logits.float(), -1), F.softmax(targets.float(), -1), reduction="none").sum(-1)
    return (kl * loss_mask).sum() / (loss_mask.sum() + 1e-5)


def forward(weights: dict, batch: dict, shape: dict, ttt_steps: int, given_tokens: list | None = None) -> dict:
    """The EAGLE-3 training forward and loss for one packed batch.

    Args:
        weights: the draft's state dict (``fc.weight`` [hidden, 3*hidden], ``layers.N.*``,
            ``norm.weight``, ``lm_head.weight`` [draft_vocab, hidden], ``verifier_lm_head.weight``,
            ``embed_tokens.weight`` [vocab, hidden], ``d2t`` [draft_vocab] offsets).
        batch: ``hidden_states`` [1, T, 3*hidden], ``input_ids`` [1, T], ``lengths`` [n],
            ``loss_mask`` [1, T], ``position_ids`` [1, T], ``verifier_last_hidden_states`` [1, T, hidden].
        shape: ``layers``, ``heads``, ``kv_heads``, ``head_dim``, ``eps``, ``rope_theta``,
            ``norm_before_residual``, ``verifier_eps`` (the verifier's RMS norm epsilon, for a
            draft that normalises the verifier's last hidden state, ``verifier_norm.weight``:
            speculators 0.4).
        given_tokens: the draft tokens of each step to feed the next one ([1, T] each); None:
            this implementation's own argmax.
    Returns: ``loss`` (a tensor, differentiable), ``step_losses`` (floats), ``tokens`` (argmax per step).
    """
    hs = batch["hidden_states"][0]
    ids = batch["input_ids"][0]
    n = ids.shape[0]
    lengths = batch["lengths"]
    document = torch.repeat_interleave(torch.arange(len(lengths), device=ids.device), lengths.to(ids.device))
    document = torch.cat([document, document.new_full((n - document.shape[0],), -1)])
    mask_ = batch["loss_mask"][0].float()
    positions = batch["position_ids"][0]
    last = batch["verifier_last_hidden_states"][0]
    if "verifier_norm.weight" in weights:  # speculators 0.4: the verifier's final norm first, as the verifier does
        last = rms_norm(last, weights["verifier_norm.weight"], shape["verifier_eps"])
    targets = last @ weights["verifier_lm_head.weight"].T
    layers = [
        Layer(weights, f"layers.{i}.", shape["heads"], shape["kv_heads"], shape["head_dim"], shape["eps"])
        for i in range(shape["layers"])
    ]
    caches: list[list] = [[] for _ in layers]
    hidden = hs @ weights["fc.weight"].T
    loss = torch.zeros((), device=ids.device)
    step_losses, tokens = [], []
    for step in range(ttt_steps):
        x = torch.cat([weights["embed_tokens.weight"][ids], hidden], dim=-1)
        cos, sin = rotary(positions, shape["head_dim"], shape["rope_theta"])
        mask = allowed(document, step + 1)
        for i, layer in enumerate(layers):
            x = layer.forward(x, cos, sin, caches[i], mask, i == 0, shape["norm_before_residual"])
        hidden = x
        logits = rms_norm(x, weights["norm.weight"], shape["eps"]) @ weights["lm_head.weight"].T
        s_loss = kl_loss(logits[: n - step], targets[step:], mask_[step:])
        loss = loss + s_loss
        step_losses.append(s_loss.item())
        own = logits.argmax(-1)
        tokens.append(own)
        chosen = own if given_tokens is None else given_tokens[step][0]
        ids = chosen + weights["d2t"][chosen]
        positions = positions + 1
    return {"loss": loss, "step_losses": step_losses, "tokens": tokens}

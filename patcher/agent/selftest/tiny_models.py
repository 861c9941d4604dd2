"""Tiny random checkpoints of the architectures users extract hidden states from.

Runs under the target's interpreter (torch, transformers, safetensors, tokenizers: what
vLLM itself needs). No hub, no downloads: configs are written here, weights are random
(seeded), the tokenizer is a WordLevel vocabulary saved as ``PreTrainedTokenizerFast``.

Architectures (``ARCHS``):
- ``llama``: ``LlamaForCausalLM``, hidden 128, 2 heads of 64 (vLLM's CPU attention rejects
  head_dim 16), 6 layers.
- ``deepseek_v3``: ``DeepseekV3ForCausalLM`` (Kimi-K2's text model): MLA dims, MoE with a
  shared expert, ``noaux_tc`` routing with sigmoid scores and an ``e_score_correction_bias``
  per MoE layer, first layer dense.
- ``kimi_k25``: vLLM's ``KimiK25ForConditionalGeneration`` around that DeepSeek-V3 text
  model (``kimi_k25.py``).

``from_config`` shrinks a real model's ``config.json`` to this size while keeping what
changes the hidden-state path: attention kind (MLA ranks), rope scaling (YaRN included),
``llama_4_scaling``, MoE routing settings and the dense-first layers.
"""

from __future__ import annotations

import json
from pathlib import Path

from .weights import load_exactly, router_bias_as_vllm, unfuse_experts

VOCAB_SIZE = 512

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    # One head on CPU: vLLM's CPU rotary kernel (RotaryEmbedding.forward_cpu, 0.16) mis-rotates
    # queries with more heads than the single shared rope key, the shape DeepseekV2Attention
    # has with MLA disabled (max error 3.4 for 2 heads vs 0.016 for 1). A vLLM CPU bug that
    # would fail the comparison whatever speculators does. ``for_device`` raises it on GPUs.
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "q_lora_rank": 64,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "n_routed_experts": 4,
    # Every expert active: no bf16 routing ties between vLLM and transformers.
    "num_experts_per_tok": 4,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    # Attention far from uniform, so positional changes (rope scaling) show in the states.
    "initializer_range": 0.1,
}

ARCHS = {"llama": LLAMA, "deepseek_v3": DEEPSEEK_V3, "kimi_k25": DEEPSEEK_V3}
SEEDS = {"llama": 1234, "deepseek_v3": 4321, "kimi_k25": 4321}

# Keys of a real config that change the hidden-state path and are kept by ``from_config``.
_KEEP_DEEPSEEK = (
    "rope_scaling",
    "rope_theta",
    "max_position_embeddings",
    "llama_4_scaling",
    "topk_method",
    "scoring_func",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "routed_scaling_factor",
    "n_shared_experts",
    "moe_layer_freq",
    "attention_bias",
    "rms_norm_eps",
)
_KEEP_LLAMA = (
    "rope_scaling",
    "rope_theta",
    "max_position_embeddings",
    "rms_norm_eps",
    "attention_bias",
    "mlp_bias",
    "hidden_act",
)
ARCH_OF = {
    "LlamaForCausalLM": "llama",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV2ForCausalLM": "deepseek_v3",
    "KimiK25ForConditionalGeneration": "kimi_k25",
}


class UnsupportedModel(ValueError):
    """A ``--model`` whose architecture selftest cannot shrink (message names it)."""


def arch_of(config: dict) -> str:
    """The selftest architecture for a real ``config.json``. Raises ``UnsupportedModel``."""
    for name in config.get("architectures") or []:
        if name in ARCH_OF:
            return ARCH_OF[name]
    raise UnsupportedModel(
        f"architecture {config.get('architectures')} is not one selftest can build "
        f"(supported: {', '.join(sorted(ARCH_OF))})"
    )


def from_config(config: dict) -> dict:
    """A tiny config of ``config``'s architecture (its text config for Kimi-K2.5), keeping
    rope scaling, ``llama_4_scaling``, MLA ranks present/absent, MoE routing and dense-first
    layers. Raises ``UnsupportedModel``."""
    arch = arch_of(config)
    text = config.get("text_config") or config if arch == "kimi_k25" else config
    if arch == "llama":
        tiny = dict(LLAMA)
        tiny.update({k: text[k] for k in _KEEP_LLAMA if k in text})
        return tiny
    tiny = dict(DEEPSEEK_V3)
    tiny.update({k: text[k] for k in _KEEP_DEEPSEEK if k in text})
    if text.get("q_lora_rank") is None and "q_lora_rank" in text:
        tiny["q_lora_rank"] = None  # DeepSeek-V2-Lite style: queries without a low-rank path
    dense = int(text.get("first_k_dense_replace", 1))
    tiny["first_k_dense_replace"] = min(dense, tiny["num_hidden_layers"] - 1)
    if text.get("n_routed_experts") is None:  # a dense model of this family
        tiny["first_k_dense_replace"] = tiny["num_hidden_layers"]
    return tiny


# DeepSeek-V3's (and Kimi-K2.5's) MLA head shapes. GPU MLA kernels are built for them: the
# latent cache row kv_lora_rank + qk_rope_head_dim = 576 is the only head size vLLM's MLA
# backends accept (MLACommonBackend.get_supported_head_sizes, vllm/model_executor/layers/
# attention/mla_attention.py; "Head dimension 96 is not supported by MLA." for the CPU shapes
# on an H200), and the prefill kernels take qk 192 / v 128 (FlashAttention 3, FlashInfer).
MLA_GPU = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}


def for_device(config: dict, device: str, tp: int = 1) -> dict:
    """``config`` adapted to the device and tensor parallel size: every rank gets whole
    heads. DeepSeek attention keeps one head per rank on CPU (see ``DEEPSEEK_V3``; MLA is
    disabled there) and four per rank elsewhere, where MLA runs with ``MLA_GPU``'s head
    shapes; Llama keeps head_dim 64 (hidden = 64 x heads)."""
    if config["model_type"] == "deepseek_v3":
        if device == "cpu":
            return {**config, "num_attention_heads": tp, "num_key_value_heads": tp}
        return {**config, **MLA_GPU, "num_attention_heads": 4 * tp, "num_key_value_heads": 4 * tp}
    heads = max(config["num_attention_heads"], tp)
    if heads == config["num_attention_heads"] and heads % tp == 0:
        return config
    heads = -(-heads // tp) * tp
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return {**config, "num_attention_heads": heads, "num_key_value_heads": heads, "hidden_size": head_dim * heads}


def save_tokenizer(dest: Path, vocab_size: int = VOCAB_SIZE) -> None:
    """A WordLevel tokenizer of ``vocab_size`` entries (``<unk> <s> </s> <pad> w0 w1 …``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for i in range(vocab_size - len(specials)):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    ).save_pretrained(dest)


def random_state(config: dict, seed: int) -> dict:
    """Seeded random weights of a transformers causal LM built from ``config``, in bf16,
    plus the ``e_score_correction_bias`` vLLM's ``noaux_tc`` router loads per MoE layer
    (fp32, shape ``[n_routed_experts]``). Keys as transformers names them (``model.…``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.float32)
    state = unfuse_experts({k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()})
    if config["model_type"] == "deepseek_v3":
        gen = torch.Generator().manual_seed(seed + 1)
        for i in range(config["first_k_dense_replace"], config["num_hidden_layers"]):
            state[f"model.layers.{i}.mlp.gate.e_score_correction_bias"] = (
                0.01 * torch.randn(config["n_routed_experts"], generator=gen)
            ).to(torch.float32)
    return state


def build(arch: str, dest: Path, config: dict | None = None, device: str = "cpu", tp: int = 1) -> dict:
    """Write a tiny checkpoint of ``arch`` into the new directory ``dest``; return the text
    config used. ``config`` overrides the default (e.g. ``from_config`` of a real model)."""
    from safetensors.torch import save_file

    config = for_device(config or ARCHS[arch], device, tp)
    dest.mkdir(parents=True)
    save_tokenizer(dest, config["vocab_size"])
    if arch == "kimi_k25":
        from . import kimi_k25

        kimi_k25.build(dest, config, SEEDS[arch])
        return config
    save_file(random_state(config, SEEDS[arch]), str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


def load_reference(arch: str, model_dir: Path, dtype, device: str):
    """The transformers model to compare against (eval mode): the checkpoint itself, or for
    Kimi-K2.5 a ``DeepseekV3ForCausalLM`` holding its language-model weights."""
    if arch == "kimi_k25":
        from . import kimi_k25

        return kimi_k25.load_reference(model_dir, dtype, device)
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    # Built and loaded by hand rather than from_pretrained: every tensor must come from the
    # checkpoint (no silent random init), with transformers 5's fused experts re-stacked.
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), torch_dtype=dtype)
    state = load_file(str(Path(model_dir) / "model.safetensors"))
    load_exactly(model, state, model_dir)
    return router_bias_as_vllm(model.to(device=device, dtype=dtype).eval(), state, device)

"""selftest's ``--model``: a real config shrunk to a tiny model of the same architecture,
keeping what changes the hidden-state path (pure functions: no torch needed)."""

from __future__ import annotations

import pytest

from patcher.agent.selftest import tiny_models
from patcher.agent.selftest.tiny_models import DEEPSEEK_V3, LLAMA, UnsupportedModel, arch_of, for_device, from_config

pytestmark = pytest.mark.fast

YARN = {
    "type": "yarn",
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
KIMI_TEXT = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 1,
    "n_routed_experts": 384,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.827,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "rope_scaling": YARN,
    "max_position_embeddings": 262144,
    "llama_4_scaling": {"original_max_position_embeddings": 8192, "beta": 0.1},
}


def test_kimi_k25_keeps_rope_scaling_routing_and_scaling_at_tiny_size():
    real = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": KIMI_TEXT}
    assert arch_of(real) == "kimi_k25"
    tiny = from_config(real)
    assert tiny["rope_scaling"] == YARN and tiny["llama_4_scaling"] == KIMI_TEXT["llama_4_scaling"]
    assert (tiny["topk_method"], tiny["scoring_func"], tiny["routed_scaling_factor"]) == ("noaux_tc", "sigmoid", 2.827)
    assert tiny["max_position_embeddings"] == 262144
    assert (
        tiny["hidden_size"] == DEEPSEEK_V3["hidden_size"]
        and tiny["n_routed_experts"] == DEEPSEEK_V3["n_routed_experts"]
    )
    assert tiny["first_k_dense_replace"] == 1 and tiny["num_hidden_layers"] == DEEPSEEK_V3["num_hidden_layers"]


def test_deepseek_v2_lite_without_query_lora_and_many_dense_layers():
    tiny = from_config(
        {**KIMI_TEXT, "architectures": ["DeepseekV2ForCausalLM"], "q_lora_rank": None, "first_k_dense_replace": 10}
    )
    assert tiny["q_lora_rank"] is None
    assert tiny["first_k_dense_replace"] == tiny["num_hidden_layers"] - 1  # at least one MoE layer stays


def test_llama_keeps_llama3_rope_scaling():
    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    tiny = from_config(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 4096,
            "rope_scaling": rope,
            "rope_theta": 500000.0,
        }
    )
    assert (
        tiny["rope_scaling"] == rope and tiny["rope_theta"] == 500000.0 and tiny["hidden_size"] == LLAMA["hidden_size"]
    )


@pytest.mark.parametrize("architectures", [["MixtralForCausalLM"], [], None])
def test_unsupported_architecture_is_named(architectures):
    with pytest.raises(UnsupportedModel, match="not one selftest can build"):
        arch_of({"architectures": architectures})


@pytest.mark.parametrize("device, tp, heads", [("cpu", 1, 1), ("cpu", 2, 2), ("cuda", 1, 4), ("cuda", 8, 32)])
def test_deepseek_heads_per_rank(device, tp, heads):
    assert for_device(DEEPSEEK_V3, device, tp)["num_attention_heads"] == heads


@pytest.mark.parametrize("device", ["cuda", "rocm"])
def test_deepseek_on_gpus_has_the_mla_shapes_gpu_kernels_take(device):
    config = for_device(DEEPSEEK_V3, device)
    assert config["kv_lora_rank"] + config["qk_rope_head_dim"] == 576  # the one MLA head size
    assert (config["qk_nope_head_dim"] + config["qk_rope_head_dim"], config["v_head_dim"]) == (192, 128)
    cpu = for_device(DEEPSEEK_V3, "cpu")
    assert cpu["kv_lora_rank"] == DEEPSEEK_V3["kv_lora_rank"]  # the CPU engine's proofs keep their model


@pytest.mark.parametrize("tp, heads, hidden", [(1, 2, 128), (2, 2, 128), (4, 4, 256), (8, 8, 512)])
def test_llama_whole_heads_of_64_per_rank(tp, heads, hidden):
    config = for_device(LLAMA, "cuda", tp)
    assert (config["num_attention_heads"], config["hidden_size"]) == (heads, hidden)
    assert config["hidden_size"] // config["num_attention_heads"] == 64


def test_every_arch_has_a_seed():
    assert set(tiny_models.ARCHS) == set(tiny_models.SEEDS)

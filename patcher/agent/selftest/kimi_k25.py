"""A tiny random Kimi-K2.5 checkpoint that vLLM's real ``KimiK25ForConditionalGeneration`` runs.

Runs under the target's interpreter: standard library plus torch, transformers (<5),
safetensors and tokenizers. Nothing is downloaded: the config is written here, the weights are
seeded random, and the image processor vLLM insists on loading is a small Python file written
into the checkpoint directory (``trust_remote_code=True`` on a local directory imports it).

What vLLM 0.16.0 needs, and where it says so (paths under ``vllm/``):

- Config. ``transformers_utils/config.py:85`` maps ``model_type: kimi_k25`` to vLLM's own
  ``KimiK25Config`` (``transformers_utils/configs/kimi_k25.py:63-119``), which builds
  ``text_config`` as a transformers ``DeepseekV3Config(**dict)`` (unknown keys such as
  ``topk_method`` or ``llama_4_scaling`` stay attributes) and ``vision_config`` as
  ``KimiK25VisionConfig(**dict)`` (``:14-60``; defaults are the real 27-layer MoonViT, so every
  size is written out here). ``transformers_utils/config.py:717-718`` turns the text config's
  ``rope_scaling`` into the ``rope_parameters`` that ``models/deepseek_v2.py:483-503`` reads
  (YaRN becomes ``deepseek_yarn`` plus the ``mscale_all_dim`` softmax factor).
- Model. ``models/kimi_k25.py:343-394`` always builds ``MoonViT3dPretrainedModel`` and
  ``KimiK25MultiModalProjector`` (``models/kimi_k25_vit.py:538-577, 642-670``) next to
  ``language_model`` (a ``DeepseekV2ForCausalLM``), and the default loader refuses a checkpoint
  that leaves any parameter unset (``model_loader/default_loader.py:301-305``), so the tower
  and projector weights are written too, at tiny sizes the code accepts (head dim divisible by
  4 for ``Rope2DPosEmbRepeated``, ``kimi_k25_vit.py:233``). Checkpoint names: ``language_model.model.*`` /
  ``language_model.lm_head.*`` as vLLM names them; ``mm_projector.proj.0`` / ``proj.2`` are
  renamed to ``linear_1`` / ``linear_2`` by ``hf_to_vllm_mapper`` (``kimi_k25.py:321-330``).
- Processor. ``KimiK25ProcessingInfo.__init__`` (``kimi_k25.py:169-182``) loads the image
  processor with ``cached_get_image_processor(model, trust_remote_code=True)``, i.e.
  ``AutoImageProcessor.from_pretrained`` (``transformers_utils/processor.py:311-347``), which
  follows ``auto_map`` in ``preprocessor_config.json``. vLLM then uses its
  ``num_frames_per_chunk`` (``:201``), ``media_tokens_calculator(chunk)`` (``:182, 217, 289``),
  ``preprocess(vision_chunks)`` returning ``pixel_values [N, 3, ps, ps]`` and
  ``grid_thws [B, 3]`` (``:136, 253-276``) and ``split_video_chunks`` (``:300-301``).
- Start-up profiling. ``MultiModalBudget`` (``multimodal/encoder_budget.py:86-91``, via
  ``get_mm_max_toks_per_item`` ``:15-41``) processes one dummy item:
  ``KimiK25DummyInputsBuilder`` (``kimi_k25.py:195-244``) pairs the text ``"<|media_pad|>"``
  with a 3000x3000 image, ``MoonshotKimiVAutoProcessor.__call__`` (``:132-159``) tokenizes that
  text and expands each ``media_placeholder_token_id`` in it by the calculator's count, and
  ``_maybe_apply_prompt_updates`` (``multimodal/processing/processor.py:1721-1746``) then wants
  exactly one placeholder run. So the tokenizer must encode ``"<|media_pad|>"`` as exactly one
  token, the config's ``media_placeholder_token_id``. Our image processor shrinks every image to
  one grid of ``2 x 2`` patches of ``2 x 2`` pixels, equal to the position-embedding grid (so
  ``Learnable2DInterpPosEmbDivided_fixed.forward`` skips its ``torch.compile``d interpolation,
  ``kimi_k25_vit.py:160-167``) and merged into one token (``tpool_patch_merger`` ``:514-535``).

Text-only prompts never reach the vision tower: the hidden states are the language model's,
which ``load_reference`` rebuilds as a transformers ``DeepseekV3ForCausalLM``. Prompt token ids
must stay below ``vocab_size``: the added media token passes vLLM's out-of-vocabulary check
(``v1/engine/input_processor.py:708-724`` takes the larger of tokenizer and model sizes) but
has no embedding row.
"""

from __future__ import annotations

import json
import pathlib

# The image-processor module written into the checkpoint and the class auto_map names.
PROCESSOR_MODULE = "kimi_k25_tiny_processor"
PROCESSOR_CLASS = "KimiK25TinyImageProcessor"
# transformers (< 5) has no kimi_k25 config: speculators 0.3.0's generator reads the model's
# layer count with AutoConfig.from_pretrained(path, trust_remote_code=True), which follows
# auto_map to this module, as it does for the real checkpoint's own configuration file. vLLM
# ignores it: its own registry maps kimi_k25 first (transformers_utils/config.py:155).
CONFIG_MODULE = "configuration_kimi_k25_tiny"
CONFIG_SOURCE = '''from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25TinyConfig(PretrainedConfig):
    """Kimi-K2.5 wrapper config for transformers: text_config is a DeepseekV3Config."""

    model_type = "kimi_k25"

    def __init__(self, text_config=None, vision_config=None, **kwargs):
        if text_config is None or isinstance(text_config, dict):
            text_config = DeepseekV3Config(**(text_config or {}))
        self.text_config = text_config
        self.vision_config = vision_config or {}
        super().__init__(**kwargs)
'''
MEDIA_TOKEN = "<|media_pad|>"  # the dummy text of KimiK25DummyInputsBuilder.get_dummy_text

# A tiny MoonViT the vLLM code accepts: patch 2 px, a 2 x 2 patch grid (= the position
# embedding grid) merged 2 x 2 into one token; one layer of one head of dim 8 (divisible by 4).
VISION_CONFIG = {
    "patch_size": 2,
    "init_pos_emb_height": 2,
    "init_pos_emb_width": 2,
    "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed",
    "num_attention_heads": 1,
    "num_hidden_layers": 1,
    "hidden_size": 8,
    "intermediate_size": 16,
    "merge_kernel_size": [2, 2],
    "video_attn_type": "spatial_temporal",
    "merge_type": "sd2_tpool",
    "mm_projector_type": "patchmerger",
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-5,
}
FRAMES_PER_CHUNK = 1  # video chunk length; <= init_pos_emb_time (kimi_k25_vit.py:159)

_PROCESSOR_SOURCE = '''\
"""Tiny stand-in for Kimi-K2.5's media processor (written by speculators-patch selftest).

Every image (or video frame) is resized to grid_h*patch_size x grid_w*patch_size pixels and cut
into patches; a chunk of t frames gives grid_thws (t, grid_h, grid_w) and
(grid_h // merge_h) * (grid_w // merge_w) tokens after vLLM's 2x2 patch merger.
"""

import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature


class {cls}(BaseImageProcessor):
    model_input_names = ["pixel_values", "grid_thws"]

    def __init__(self, patch_size=2, grid_size=(2, 2), merge_kernel_size=(2, 2),
                 num_frames_per_chunk=1, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = int(patch_size)
        self.grid_size = tuple(int(x) for x in grid_size)
        self.merge_kernel_size = tuple(int(x) for x in merge_kernel_size)
        self.num_frames_per_chunk = int(num_frames_per_chunk)

    @staticmethod
    def _frames(chunk):
        if chunk["type"] == "image":
            return [chunk["image"]]
        if chunk["type"] == "video_chunk":
            return list(chunk["video_chunk"])
        raise ValueError(f"unknown vision chunk type {{chunk['type']!r}}")

    def media_tokens_calculator(self, chunk):
        (gh, gw), (kh, kw) = self.grid_size, self.merge_kernel_size
        return (gh // kh) * (gw // kw)

    def _patches(self, frames):
        ps, (gh, gw) = self.patch_size, self.grid_size
        arrays = [np.asarray(f.convert("RGB").resize((gw * ps, gh * ps)), dtype=np.float32) / 127.5 - 1.0
                  for f in frames]
        x = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)  # t, 3, H, W
        t = x.shape[0]
        x = x.reshape(t, 3, gh, ps, gw, ps).permute(0, 2, 4, 1, 3, 5)  # t, gh, gw, 3, ps, ps
        return x.reshape(t * gh * gw, 3, ps, ps), [t, gh, gw]

    def preprocess(self, vision_chunks, **kwargs):
        pixels, grids = [], []
        for chunk in vision_chunks:
            p, g = self._patches(self._frames(chunk))
            pixels.append(p)
            grids.append(g)
        return BatchFeature(data={{"pixel_values": torch.cat(pixels), "grid_thws": torch.tensor(grids)}})

    def __call__(self, vision_chunks, **kwargs):
        return self.preprocess(vision_chunks, **kwargs)

    def split_video_chunks(self, video):
        frames = list(video)
        n = self.num_frames_per_chunk
        return [{{"type": "video_chunk", "video_chunk": frames[i:i + n]}} for i in range(0, len(frames), n)]
'''


def _text_hf_config(text_config: dict):
    """A transformers ``DeepseekV3Config`` of the plain dict (``model_type`` dropped)."""
    from transformers import AutoConfig

    return AutoConfig.for_model("deepseek_v3", **{k: v for k, v in text_config.items() if k != "model_type"})


def _add_media_token(dest: pathlib.Path, vocab_size: int) -> int:
    """Make the tokenizer in ``dest`` encode ``MEDIA_TOKEN`` as one token; return its id.

    Kept if the tokenizer already has it. Otherwise it is added as a special token after the
    existing vocabulary (id ``vocab_size``): no id below ``vocab_size`` changes and no text
    prompt can produce it. The model never embeds it: only the start-up profiling prompt
    (kimi_k25.py:203-205) holds it. Raises ``ValueError`` if the tokenizer's size is not
    ``vocab_size`` or the token does not encode to a single id."""
    from transformers import AddedToken, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(dest))
    media_id = tok.convert_tokens_to_ids(MEDIA_TOKEN)
    if media_id is None or media_id == tok.unk_token_id:
        if len(tok) != vocab_size:
            raise ValueError(f"tokenizer in {dest} has {len(tok)} tokens, text_config vocab_size is {vocab_size}")
        tok.add_tokens([AddedToken(MEDIA_TOKEN, special=True, normalized=False)], special_tokens=True)
        tok.save_pretrained(str(dest))
        tok = AutoTokenizer.from_pretrained(str(dest))
        media_id = tok.convert_tokens_to_ids(MEDIA_TOKEN)
    ids = tok.encode(MEDIA_TOKEN)
    if ids.count(media_id) != 1:
        raise ValueError(f"tokenizer in {dest} encodes {MEDIA_TOKEN!r} as {ids}, not one token {media_id}")
    return int(media_id)


def _language_state(hf_config, text_config: dict, seed: int) -> dict:
    """Seeded transformers ``DeepseekV3ForCausalLM`` weights in bf16, keys as transformers
    names them (``model.*``, ``lm_head.weight``), with a seeded non-zero fp32
    ``model.layers.{i}.mlp.gate.e_score_correction_bias`` (shape ``[n_routed_experts]``) for
    every MoE layer: vLLM's ``noaux_tc`` router loads one per MoE layer. Its values are
    bf16-representable so a bf16 reference holds exactly the same numbers."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(hf_config)  # float32 init, then rounded to bf16
    from .weights import unfuse_experts

    state = unfuse_experts({k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()})
    gen = torch.Generator().manual_seed(seed + 1)
    for key in sorted(state):
        if key.endswith(".mlp.gate.e_score_correction_bias"):
            bias = 0.01 * torch.randn(state[key].shape, generator=gen)
            state[key] = bias.to(torch.bfloat16).to(torch.float32)
    n_moe = sum(k.endswith("e_score_correction_bias") for k in state)
    expected = 0
    if text_config.get("n_routed_experts"):
        first_dense = int(text_config.get("first_k_dense_replace", 0))
        freq = int(text_config.get("moe_layer_freq", 1))
        expected = sum(1 for i in range(int(text_config["num_hidden_layers"])) if i >= first_dense and i % freq == 0)
    if n_moe != expected:
        raise ValueError(f"transformers built {n_moe} MoE routers, the config describes {expected}")
    return state


def _vision_state(vision: dict, text_hidden: int, seed: int) -> dict:
    """Seeded bf16 weights for every ``vision_tower.*`` / ``mm_projector.*`` parameter vLLM
    creates (shapes from ``kimi_k25_vit.py``: patch conv ``[d, 3, ps, ps]`` ``:206``, position
    embedding ``[h, w, d]`` ``:142``, per block ``norm0/norm1`` ``:360-361``, ``mlp.fc0/fc1``
    ``:313-326``, fused ``wqkv [3d, d]`` with bias ``:368-376``, ``wo`` ``:377-383``; encoder
    ``final_layernorm`` ``:484``; projector ``pre_norm [d]`` and two linears of
    ``d * kh * kw`` then to the text hidden size ``:658-670``)."""
    import torch

    d, m, ps = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    kh, kw = vision["merge_kernel_size"]
    merged = d * kh * kw
    shapes = {
        "vision_tower.patch_embed.proj.weight": (d, 3, ps, ps),
        "vision_tower.patch_embed.proj.bias": (d,),
        "vision_tower.patch_embed.pos_emb.weight": (vision["init_pos_emb_height"], vision["init_pos_emb_width"], d),
        "vision_tower.encoder.final_layernorm.weight": (d,),
        "vision_tower.encoder.final_layernorm.bias": (d,),
        "mm_projector.pre_norm.weight": (d,),
        "mm_projector.pre_norm.bias": (d,),
        "mm_projector.proj.0.weight": (merged, merged),
        "mm_projector.proj.0.bias": (merged,),
        "mm_projector.proj.2.weight": (text_hidden, merged),
        "mm_projector.proj.2.bias": (text_hidden,),
    }
    for i in range(vision["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{i}"
        shapes.update(
            {
                f"{b}.norm0.weight": (d,),
                f"{b}.norm0.bias": (d,),
                f"{b}.norm1.weight": (d,),
                f"{b}.norm1.bias": (d,),
                f"{b}.mlp.fc0.weight": (m, d),
                f"{b}.mlp.fc0.bias": (m,),
                f"{b}.mlp.fc1.weight": (d, m),
                f"{b}.mlp.fc1.bias": (d,),
                f"{b}.wqkv.weight": (3 * d, d),
                f"{b}.wqkv.bias": (3 * d,),
                f"{b}.wo.weight": (d, d),
                f"{b}.wo.bias": (d,),
            }
        )
    gen = torch.Generator().manual_seed(seed + 2)
    state = {}
    for name in sorted(shapes):
        if "norm" in name:
            value = torch.ones(shapes[name]) if name.endswith(".weight") else torch.zeros(shapes[name])
        else:
            value = 0.02 * torch.randn(shapes[name], generator=gen)
        state[name] = value.to(torch.bfloat16).contiguous()
    return state


def build(dest: pathlib.Path, text_config: dict, seed: int) -> None:
    """Write a tiny random Kimi-K2.5 checkpoint into ``dest``.

    ``dest`` must exist and already hold a tokenizer (``PreTrainedTokenizerFast`` files) whose
    size is ``text_config["vocab_size"]``. ``text_config`` is a plain DeepSeek-V3 config dict
    (``architectures: [DeepseekV3ForCausalLM]``, ``model_type: deepseek_v3``, MLA and MoE
    keys; may carry ``rope_scaling`` (YaRN) and ``llama_4_scaling``); ``seed`` makes the
    weights reproducible.

    Writes:
    - ``config.json``: ``KimiK25ForConditionalGeneration`` / ``kimi_k25`` with ``text_config``
      (transformers' full ``DeepseekV3Config`` dict updated with ``text_config``, so keys
      transformers does not know survive), the tiny ``VISION_CONFIG`` and
      ``media_placeholder_token_id``; dtype bf16.
    - ``model.safetensors``: ``language_model.`` + every tensor of a seeded transformers
      ``DeepseekV3ForCausalLM`` (bf16; the per-MoE-layer ``e_score_correction_bias`` in fp32),
      plus seeded bf16 ``vision_tower.*`` / ``mm_projector.*`` tensors.
    - ``preprocessor_config.json`` naming ``PROCESSOR_MODULE.PROCESSOR_CLASS`` in ``auto_map``
      and that module's source (``kimi_k25_tiny_processor.py``).
    - The tokenizer gains one special token ``"<|media_pad|>"`` with id ``vocab_size`` unless it
      already has one (see ``_add_media_token``): vLLM's start-up profiling tokenizes it.

    Raises ``FileNotFoundError`` if ``dest`` does not exist and ``ValueError`` if the tokenizer
    does not match ``vocab_size`` or ``text_config`` describes no DeepSeek-V3 model.
    """
    from safetensors.torch import save_file

    dest = pathlib.Path(dest)
    if not dest.is_dir():
        raise FileNotFoundError(f"{dest} does not exist (the caller writes the tokenizer there first)")
    if text_config.get("model_type") != "deepseek_v3":
        raise ValueError(f"text_config model_type is {text_config.get('model_type')!r}, expected 'deepseek_v3'")
    vocab_size = int(text_config["vocab_size"])
    media_id = _add_media_token(dest, vocab_size)

    hf_config = _text_hf_config(text_config)
    text = json.loads(hf_config.to_json_string())
    text.update(text_config)  # keep keys transformers drops (topk_method, llama_4_scaling, ...)
    state = {f"language_model.{k}": v for k, v in _language_state(hf_config, text_config, seed).items()}
    state.update(_vision_state(VISION_CONFIG, int(text_config["hidden_size"]), seed))
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})

    _write_config(dest, text, int(text_config["hidden_size"]), media_id)
    _write_image_processor(dest)


def _write_config(dest: pathlib.Path, text: dict, text_hidden: int, media_id: int) -> None:
    """``config.json`` (``KimiK25ForConditionalGeneration`` around the full text config ``text``
    and the tiny ``VISION_CONFIG``) and the config module its ``auto_map`` names."""
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": dict(VISION_CONFIG, mm_hidden_size=text_hidden),
        "media_placeholder_token_id": media_id,
        "pad_token_id": int(text.get("pad_token_id") or 0),
        "ignore_index": -100,
        "use_unified_vision_chunk": False,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "tie_word_embeddings": bool(text.get("tie_word_embeddings", False)),
        "torch_dtype": "bfloat16",
        "auto_map": {"AutoConfig": f"{CONFIG_MODULE}.KimiK25TinyConfig"},
    }
    (dest / f"{CONFIG_MODULE}.py").write_text(CONFIG_SOURCE)
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_image_processor(dest: pathlib.Path) -> None:
    """The image processor module (``PROCESSOR_MODULE``) and the ``preprocessor_config.json``
    that names it in ``auto_map``, with the tiny geometry of ``VISION_CONFIG``."""
    (dest / f"{PROCESSOR_MODULE}.py").write_text(_PROCESSOR_SOURCE.format(cls=PROCESSOR_CLASS))
    ps = VISION_CONFIG["patch_size"]
    preprocessor = {
        "auto_map": {"AutoImageProcessor": f"{PROCESSOR_MODULE}.{PROCESSOR_CLASS}"},
        "patch_size": ps,
        "grid_size": [VISION_CONFIG["init_pos_emb_height"], VISION_CONFIG["init_pos_emb_width"]],
        "merge_kernel_size": VISION_CONFIG["merge_kernel_size"],
        "num_frames_per_chunk": FRAMES_PER_CHUNK,
        # vLLM >= 0.32 processes media itself (transformers_utils/processors/
        # kimi_k25_vision_fused.py, KimiK25FusedVisionProcessor) from the checkpoint's
        # media_proc_cfg, as the real Kimi-K2.5 ships it: the same tiny geometry here.
        "media_proc_cfg": {
            "patch_size": ps,
            "merge_kernel_size": VISION_CONFIG["merge_kernel_size"][0],
            "in_patch_limit": VISION_CONFIG["init_pos_emb_height"] * VISION_CONFIG["init_pos_emb_width"],
            "patch_limit_on_one_side": max(VISION_CONFIG["init_pos_emb_height"], VISION_CONFIG["init_pos_emb_width"]),
            "in_patch_limit_each_frame": VISION_CONFIG["init_pos_emb_height"] * VISION_CONFIG["init_pos_emb_width"],
            "in_patch_limit_video": VISION_CONFIG["init_pos_emb_height"] * VISION_CONFIG["init_pos_emb_width"],
            "fixed_output_tokens": None,
            "temporal_merge_kernel_size": FRAMES_PER_CHUNK,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
        },
    }
    (dest / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2, sort_keys=True) + "\n")


def load_reference(dest: pathlib.Path, dtype, device: str = "cpu"):
    """A transformers ``DeepseekV3ForCausalLM`` (eval mode, ``dtype`` / ``device``) holding
    exactly the ``language_model.*`` tensors of the checkpoint at ``dest``, built from its
    ``config.json`` ``text_config``: the reference for hidden-state comparison
    (``output_hidden_states=True``; vLLM's layer ``i`` output is ``hidden_states[i + 1]``).

    Not modelled: ``llama_4_scaling``. vLLM multiplies the queries by
    ``1 + beta * log(1 + floor(position / original_max_position_embeddings))``
    (``models/deepseek_v2.py:388-396, 548-549``); transformers 4.57's DeepSeek-V3 ignores the
    key, so past that position the reference and vLLM part ways (measured with an original
    length of 16: per-token cosine down to -0.14 by 500 tokens, 0.9997 before position 16).

    Raises ``ValueError`` if the checkpoint's language-model tensors and the model's
    differ in names (``RuntimeError`` from ``load_state_dict`` on a shape mismatch)."""
    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM

    from .weights import load_exactly, router_bias_as_vllm

    dest = pathlib.Path(dest)
    text_config = json.loads((dest / "config.json").read_text())["text_config"]
    hf_config = _text_hf_config(text_config)
    prefix = "language_model."
    state = {k[len(prefix) :]: v for k, v in load_file(str(dest / "model.safetensors")).items() if k.startswith(prefix)}
    model = DeepseekV3ForCausalLM(hf_config)
    load_exactly(model, state, dest)
    # The router bias values are bf16-exact (see _language_state), kept fp32 as vLLM does.
    return router_bias_as_vllm(model.to(device=device, dtype=dtype).eval(), state, device)

"""``patcher/agent/selftest/kimi_k25.py`` under the engine environment's interpreter, without
starting vLLM (about 10 s): the files vLLM's ``KimiK25ForConditionalGeneration`` needs are
there, the image processor loads from the checkpoint directory alone, the profiling text
``<|media_pad|>`` is one token, and ``load_reference`` holds exactly the checkpoint's
language-model tensors. The engine start itself is measured in the module's report."""

from __future__ import annotations

import json
import subprocess

import pytest
from targets import ROOT, ensure_engine_env

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

SCRIPT = r"""
import importlib.util, json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoImageProcessor, AutoTokenizer, PreTrainedTokenizerFast
from PIL import Image

sys.path.insert(0, sys.argv[2])
from patcher.agent.selftest import kimi_k25 as kimi  # as selftest ships it: inside its package
from fixtures.models import DEEPSEEK_V3
dest = Path(sys.argv[3])
vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", "<pad>"])}
vocab.update({f"w{i}": i + 4 for i in range(DEEPSEEK_V3["vocab_size"] - 4)})
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>").save_pretrained(dest)
yarn = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 1.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
kimi.build(dest, {**DEEPSEEK_V3, "rope_scaling": yarn}, 4321)
first = load_file(str(dest / "model.safetensors"))
kimi.build(dest, {**DEEPSEEK_V3, "rope_scaling": yarn}, 4321)  # again: same tensors, token kept
config = json.loads((dest / "config.json").read_text())
tok = AutoTokenizer.from_pretrained(str(dest))
proc = AutoImageProcessor.from_pretrained(str(dest), trust_remote_code=True)
chunk = {"type": "image", "image": Image.new("RGB", (3000, 3000))}
out = proc.preprocess([chunk])
state = load_file(str(dest / "model.safetensors"))
ref = kimi.load_reference(dest, torch.bfloat16)
ref_state = {**dict(ref.named_parameters()), **dict(ref.named_buffers())}
lm = {k[len("language_model."):]: v for k, v in state.items() if k.startswith("language_model.")}
print(json.dumps({
    "architectures": config["architectures"], "text_rope": config["text_config"]["rope_scaling"],
    "topk_method": config["text_config"]["topk_method"], "media_id": config["media_placeholder_token_id"],
    "encoded": tok.encode("<|media_pad|>"), "w5": tok.encode("w5"), "tokenizer_len": len(tok),
    "processor": type(proc).__name__, "pixel_shape": list(out["pixel_values"].shape),
    "grid": out["grid_thws"].tolist(), "tokens_per_image": proc.media_tokens_calculator(chunk),
    "prefixes": sorted({k.split(".")[0] for k in state}),
    "rebuild_same": sorted(first) == sorted(state) and all(torch.equal(first[k], state[k]) for k in state),
    "biases": sorted(k for k in lm if k.endswith("e_score_correction_bias")),
    "ref_matches": sorted(lm) == sorted(k for k in ref_state if not k.endswith("inv_freq"))
                   and all(torch.equal(lm[k].float(), ref_state[k].float()) for k in lm),
    "ref_dtype": str(next(ref.parameters()).dtype), "ref_training": ref.training,
}))
"""


def test_build_writes_what_vllm_loads(tmp_path):
    python = ensure_engine_env() / "bin" / "python"
    proc = subprocess.run(
        [
            str(python),
            "-c",
            SCRIPT,
            str(ROOT / "patcher" / "selftest" / "remote" / "kimi_k25.py"),
            str(ROOT),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert got["text_rope"]["factor"] == 8.0 and got["topk_method"] == "noaux_tc"
    assert got["media_id"] == 512 and got["encoded"] == [512] and got["tokenizer_len"] == 513
    assert got["w5"] == [9]  # existing ids unchanged
    assert got["processor"] == "KimiK25TinyImageProcessor"
    assert got["pixel_shape"] == [4, 3, 2, 2] and got["grid"] == [[1, 2, 2]] and got["tokens_per_image"] == 1
    assert got["prefixes"] == ["language_model", "mm_projector", "vision_tower"]
    assert got["rebuild_same"]
    assert got["biases"] == [f"model.layers.{i}.mlp.gate.e_score_correction_bias" for i in (1, 2, 3)]
    assert got["ref_matches"] and got["ref_dtype"] == "torch.bfloat16" and not got["ref_training"]

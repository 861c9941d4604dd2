"""Runs under a target's Python (speculators 0.3.0, the real vLLM CPU engine): which hidden states a
draft trained on speculators' data names, and whether they are the ones its data holds.

    python aux_layers_worker.py MODEL_DIR WORKDIR OUT.json [LAYER_ID ...]
    python aux_layers_worker.py --serve VERIFIER DRAFT     # vLLM serves DRAFT; prints the layers it chose

speculators 0.3.0's pipeline as its scripts lay it out, cut to what decides the served layers:

1. data: ``VllmHiddenStatesGenerator`` (the generator's default ``layer_ids``, or LAYER_IDs as
   ``--layer-ids`` passes them) on a few prompts, each result saved as
   ``scripts/data_generation_offline.py`` saves it (``data_{i}.pt``), and the ``data_config.json``
   it writes beside them (``DataGenerationConfig.from_generator(...).to_dict()``);
2. the draft: the vocabulary mapping, ``Eagle3SpeculatorConfig`` as ``scripts/train.py`` builds it
   (no auxiliary layer ids), ``Eagle3DraftModel``, speculators' dataset and loader over the files,
   ``Trainer`` (on the CPU: ``local_rank="cpu"``, since FlexAttention has no backward here, no
   step is taken) and its checkpointer's save of epoch 0 (``Trainer.save_checkpoint``);
3. the reference: transformers' forward of the verifier (bf16) with ``output_hidden_states``:
   ``hidden_states[k]`` is the hidden state entering decoder layer ``k``, what vLLM hands a draft
   as auxiliary layer ``k``.

Writes {"generator_layer_ids", "data_config_layer_ids", "saved_ids", "num_layers", "draft",
"cosine": [[worst per-token cosine of the data's auxiliary state j to hidden_states[k]
for k in 0..num_layers-1] for j], "transformers"}, or {"error", "stage", "traceback"}.

``--serve``: vLLM itself serves the draft (``LLM(model=VERIFIER, speculative_config={"method":
"eagle3", "model": DRAFT, ...})``, eager, one short greedy generation) and the last line printed
is {"layers": [...] or null, "from": "config"|"model"|null, "tokens": n} from vLLM's log line
naming the auxiliary layers it hands the draft ("Using auxiliary layers from speculative config:
(3, 5, 6)" from the V1 runner, which logs only layers taken from the draft's config; "Using Eagle3
auxiliary layers from config|model: ..." from Model Runner V2, vLLM 0.34's
v1/worker/gpu/spec_decode/eagle/eagle3_utils.py).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import traceback
from pathlib import Path

SEQ_LEN = 512
DRAFT_VOCAB = 256
LENGTHS = (23, 40, 57, 31, 64, 18)


def generate(model_dir: Path, datadir: Path, layer_ids: list[int] | None) -> tuple[list[str], list[int]]:
    """The generator's data files and data_config.json; returns (files, generator.layer_ids)."""
    import torch
    from speculators.data_generation.config_generator import DataGenerationConfig
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    rng = random.Random(7)
    prompts = [[rng.randrange(4, 500) for _ in range(n)] for n in LENGTHS]
    generator = VllmHiddenStatesGenerator(str(model_dir), layer_ids=layer_ids, max_model_len=SEQ_LEN)
    datadir.mkdir(parents=True)
    files = []
    for i, result in enumerate(generator.generate(prompts)):
        ids = result["input_ids"]
        sample = {
            "input_ids": ids,
            "hidden_states": [h.contiguous() for h in result["hidden_states"]],
            "loss_mask": torch.ones_like(ids),
        }
        torch.save(sample, datadir / f"data_{i}.pt")
        files.append(str(datadir / f"data_{i}.pt"))
    config = DataGenerationConfig.from_generator(
        generator=generator,
        train_data_path="aux_layers_worker",
        seq_length=SEQ_LEN,
        cache_dir=str(datadir),
        num_samples=len(files),
    )
    (datadir / "data_config.json").write_text(json.dumps(config.to_dict(), indent=2))
    return files, list(generator.layer_ids)


def draft(model_dir: Path, files: list[str], save_path: Path):
    """The draft built as scripts/train.py builds it, saved by the Trainer's checkpointer."""
    from collections import Counter

    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from speculators.train.trainer import Trainer, TrainerConfig
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import AutoConfig, LlamaConfig

    verifier = AutoConfig.from_pretrained(model_dir)
    freq: Counter = Counter()
    for f in files:
        freq.update(torch.load(f, weights_only=True)["input_ids"].tolist())
    d2t, t2d = build_vocab_mappings_from_distribution(dict(freq), DRAFT_VOCAB, verifier.vocab_size)
    layer = LlamaConfig(
        vocab_size=verifier.vocab_size,
        hidden_size=verifier.hidden_size,
        intermediate_size=verifier.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=verifier.num_attention_heads,
        num_key_value_heads=verifier.num_key_value_heads,
        max_position_embeddings=verifier.max_position_embeddings,
        rms_norm_eps=verifier.rms_norm_eps,
        head_dim=getattr(verifier, "head_dim", None),
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
            verifier=VerifierConfig(name_or_path=str(model_dir), architectures=["LlamaForCausalLM"]),
        ),
    )
    model = Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t)
    dataset = Eagle3SampleFileDataset(max_len=SEQ_LEN, file_list=files, hidden_states_dtype=torch.float32)
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=SEQ_LEN, lengths=dataset.approx_lengths, num_replicas=1, rank=0
    )
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=create_collate_fn(SEQ_LEN))
    trainer = Trainer(model, TrainerConfig(lr=1e-3, num_epochs=1, save_path=str(save_path), local_rank="cpu"), loader)
    trainer.save_checkpoint(0)
    return save_path / "0"


def cosines(model_dir: Path, files: list[str]) -> list[list[float]]:
    """Worst per-token cosine of each auxiliary state the data holds to each of transformers'
    ``hidden_states[k]`` (the state entering layer k), over every prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    n = model.config.num_hidden_layers
    worst: list[list[float]] = []
    with torch.no_grad():
        for f in files:
            sample = torch.load(f, weights_only=True)
            states = model(sample["input_ids"].unsqueeze(0), output_hidden_states=True).hidden_states
            aux = sample["hidden_states"][:-1]  # the last one is the verifier's last hidden state
            if not worst:
                worst = [[1.0] * n for _ in aux]
            for j, a in enumerate(aux):
                for k in range(n):
                    c = torch.nn.functional.cosine_similarity(a.float(), states[k][0].float(), dim=-1).min().item()
                    worst[j][k] = min(worst[j][k], c)
    return [[round(c, 6) for c in row] for row in worst]


CHOSEN = re.compile(r"Using (?:Eagle3 )?auxiliary layers from (?:speculative )?(config|model): \(([\d, ]+)\)")
SERVE = """
import sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], enforce_eager=True, max_model_len=512, gpu_memory_utilization=0.3,
          speculative_config={"method": "eagle3", "model": sys.argv[2], "num_speculative_tokens": 3})
out = llm.generate([{"prompt_token_ids": list(range(10, 40))}], SamplingParams(max_tokens=16, temperature=0.0))
print("generated", len(out[0].outputs[0].token_ids))
"""


def serve(verifier: str, draft: str) -> int:
    """vLLM serves ``draft`` in a child process (its log is read there); prints the log's tail
    on failure and, last, the layers vLLM named."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    done = subprocess.run([sys.executable, "-c", SERVE, verifier, draft], capture_output=True, text=True)
    text = done.stdout + done.stderr
    chosen = CHOSEN.findall(text)
    tokens = re.findall(r"^generated (\d+)$", done.stdout, re.MULTILINE)
    if done.returncode or not tokens:
        print(text[-4000:])
    layers = [int(x) for x in chosen[-1][1].split(",")] if chosen else None
    print(
        json.dumps(
            {"layers": layers, "from": chosen[-1][0] if chosen else None, "tokens": int(tokens[-1]) if tokens else 0}
        )
    )
    return done.returncode


def main(model_dir: Path, workdir: Path, out: Path, layer_ids: list[int] | None) -> None:
    import transformers

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    report: dict = {"transformers": transformers.__version__}
    stage = "data"
    try:
        files, report["generator_layer_ids"] = generate(model_dir, workdir / "data", layer_ids)
        saved = json.loads((workdir / "data" / "data_config.json").read_text())
        report["data_config_layer_ids"] = saved["hidden_states"]["layer_ids"]
        stage = "draft"
        where = draft(model_dir, files, workdir / "checkpoints")
        report["draft"] = str(where)
        report["saved_ids"] = json.loads((where / "config.json").read_text()).get("eagle_aux_hidden_state_layer_ids")
        stage = "reference"
        report["num_layers"] = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
        report["cosine"] = cosines(model_dir, files)
    except Exception as exc:
        report.update(stage=stage, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        sys.exit(serve(sys.argv[2], sys.argv[3]))
    main(
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        Path(sys.argv[3]),
        [int(x) for x in sys.argv[4:]] or None,
    )

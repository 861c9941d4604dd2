"""speculators 0.3.0's EAGLE-3 pipeline, end to end, on a verifier that has learned real text.

Runs under the target's interpreter (torch, transformers, vLLM, speculators patched by
``speculators-patch apply``), from a checkout of this project, one step or several per call;
every step keeps its results under ``--workdir`` and is skipped when they are there:

    /path/to/env/bin/python benchmarks/real_text_pipeline.py --workdir DIR --steps verifier,responses,capture
    /path/to/env/bin/python benchmarks/real_text_pipeline.py --workdir DIR --steps capture-hf,train,serve,report --out-dir OUT

Steps (``STEPS``), as a user runs speculators 0.3.0:

- ``verifier``: ``real_text_verifier.py`` (a Llama on the Python standard library; its corpus,
  held-out loss and prompts);
- ``responses``: the training prompts answered by the verifier itself, vLLM, greedy (the draft
  is served greedy: it learns the text it will be asked to predict);
- ``capture``: speculators' ``VllmHiddenStatesGenerator`` (the patched install) on prompt +
  response, its default ``layer_ids`` (``[2, n/2, n-3, n-1]``: outputs of those decoder
  layers, the last one the verifier's last hidden state), saved as its data script saves them
  (``input_ids``, ``hidden_states``, ``loss_mask`` 1 on the response);
- ``capture-hf``: the same sequences through transformers (``output_hidden_states``: the
  output of layer i is ``hidden_states[i + 1]``; the last layer's, before the final norm, by a
  hook, since transformers' last entry is after it): the same files, and per layer the cosine
  of the two captures; also how often the target speculators 0.3.0 trains on (the verifier's
  LM head on the last hidden state *without* the final norm, ``Eagle3DraftModel.forward``)
  picks the verifier's own next token;
- ``train``: the vocabulary mapping from the responses' token counts (every token but one,
  ``DRAFT_VOCAB_SHORT_BY``, so vLLM loads the mapping), the untrained draft saved by the
  checkpointer, then speculators' ``Trainer`` for each of ``DRAFTS`` (in parallel on a GPU; on
  a CPU only the forward and the checkpointer's save: FlexAttention has no backward there).
  On a GPU it stops at ``--train-seconds``: a draft keeps the epochs it finished (the
  checkpointer saves one per epoch), is reported as stopped, and the next ``train`` call
  resumes it from its newest epoch (``TrainerConfig.resume_from_checkpoint``);
- ``serve``: vLLM serving, each of ``SERVED`` in its own engine (all at once on a GPU, each
  timed alone): the verifier alone, and with each draft as its EAGLE-3 speculator
  (``speculative_config={"method": "eagle3", "model": DRAFT, "num_speculative_tokens": k}``),
  greedy on the held-out prompts. A draft is served the ``eagle_aux_hidden_state_layer_ids``
  the install recorded (SP035), else the captured layers + 1 written here (vLLM numbers an
  auxiliary state by the layer it enters), and once without any (what unpatched 0.3.0 saves:
  vLLM then serves its own default layers);
- ``report``: the table (``report.md``) and every figure (``report.json``), copied to
  ``--out-dir``.

``--tiny``: the same steps at CPU size (minutes on two cores; the vLLM CPU engine serves).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "@@real-text-pipeline"
STEPS = ("verifier", "responses", "capture", "capture-hf", "train", "serve", "report")
SETTINGS = {
    "full": {
        "response_tokens": 192,
        "serve_tokens": 128,
        "single_stream": 4,
        "pack": 8192,
        "epochs": 20,
        "train_seconds": 450,
        "lr": 6e-4,
        "ttt": 5,
        "capture_batch": 200,
    },
    "tiny": {
        "response_tokens": 32,
        "serve_tokens": 24,
        "single_stream": 1,
        "pack": 512,
        "epochs": 1,
        "train_seconds": None,
        "lr": 6e-4,
        "ttt": 3,
        "capture_batch": 32,
    },
}
# vLLM loads a draft's d2t only when the draft vocabulary is smaller than the verifier's
# (vllm/model_executor/models/llama_eagle3.py: draft_id_to_target_id is None otherwise, and the
# checkpoint's d2t then has nowhere to go): every token but one.
DRAFT_VOCAB_SHORT_BY = 1
SERVE_TIMEOUT = 480  # s for all the engines of the serve step (a GPU call may run 8 minutes in all)
# speculators 0.3.0's scripts/train.py: uniform noise of this half-width on the hidden states and
# the verifier's last ones (NOISE_STD, AddUniformNoise; training only), 90 % of the files train and
# 10 % validate (split_files(ratio=0.9); here every tenth file, so that both captures split alike),
# loader workers with prefetch 4 and pinned memory (NUM_WORKERS 12, PREFETCH_FACTOR 4).
NOISE_STD = 0.05
VAL_EVERY = 10
LOADER_WORKERS = 12
# GPU: the epochs a draft trains are fitted to the time budget (at most SETTINGS' ``epochs``, 0.3.0's
# default 20) from steps timed before training; this share of the budget is kept for the slack.
BUDGET_SLACK = 0.1
CALIBRATION_STEPS = (4, 12)  # (untimed: compile and warm-up, timed)
# drafts trained: name -> (capture, targets through the verifier's final norm). "vllm-normed" is a
# diagnostic: the target speculators 0.4 trains on, which 0.3.0 computes without the final norm.
DRAFTS = {"vllm": ("vllm", False), "hf": ("hf", False), "vllm-normed": ("vllm", True)}
# served: name -> (draft, aux ids kept/written or removed, speculative tokens, timed one stream at
# a time too); draft None: the verifier alone
SERVED = {
    "verifier alone": (None, None, 0, True),
    "untrained, k=3": ("untrained", "ids", 3, False),
    "vLLM capture, k=3": ("vllm", "ids", 3, True),
    "vLLM capture, k=5": ("vllm", "ids", 5, True),
    "transformers capture, k=3": ("hf", "ids", 3, False),
    "vLLM capture, no ids, k=3": ("vllm", "no-ids", 3, False),
    "vLLM capture, normed targets, k=3": ("vllm-normed", "ids", 3, False),
}


def log(message: str) -> None:
    print(f"[pipeline] {message}", flush=True)


def load_module(name: str, path: Path):
    """A module from a file of this checkout (the target has none of the tool's libraries)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def verifier_module():
    return load_module("real_text_verifier", ROOT / "benchmarks" / "real_text_verifier.py")


def serve_module():
    return load_module("speculators_patch_spec_decode", ROOT / "patcher" / "agent" / "selftest" / "spec_decode.py")


class Work:
    """The work directory: paths, settings and each step's saved figures (``<step>.json``)."""

    def __init__(self, root: Path, size: str, device: str) -> None:
        self.root, self.size, self.device = root, size, device
        self.settings = dict(SETTINGS[size])
        root.mkdir(parents=True, exist_ok=True)

    @property
    def verifier(self) -> Path:
        return self.root / "verifier"

    def figures(self, step: str) -> dict | None:
        path = self.root / f"{step}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def save(self, step: str, figures: dict) -> None:
        (self.root / f"{step}.json").write_text(json.dumps(figures, indent=1))

    def prompts(self) -> dict:
        return json.loads((self.verifier / "prompts.json").read_text())

    def config(self) -> dict:
        return json.loads((self.verifier / "config.json").read_text())


# --- steps -------------------------------------------------------------------------------


def step_verifier(work: Work) -> dict:
    return verifier_module().build(work.verifier, work.size, work.device, steps=work.settings.get("verifier_steps"))


def step_responses(work: Work) -> dict:
    """The training prompts continued greedily by the verifier (vLLM)."""
    serve = serve_module()
    train = work.prompts()["train"]
    request = _request(work, "responses", None, 0)
    request["runs"] = [{"name": "train prompts", "prompts": train, "max_tokens": work.settings["response_tokens"]}]
    [result] = serve.serve_all([request], parallel=False, log=work.root / "logs")
    if "error" in result:
        raise RuntimeError("responses: vLLM failed:\n" + "\n".join(result["tail"]))
    run = result["runs"][0]
    sequences = [p + o for p, o in zip(train, run.pop("outputs"), strict=True)]
    (work.root / "sequences.json").write_text(json.dumps({"prompt_tokens": len(train[0]), "sequences": sequences}))
    figures = {
        "sequences": len(sequences),
        "response_tokens": run["output_tokens"],
        "distinct_4grams": distinct_ngrams([s[len(train[0]) :] for s in sequences]),
        "engine_start_s": result["engine_start_s"],
        "generate_s": run["seconds"],
    }
    log(f"responses: {len(sequences)} sequences, {run['output_tokens']:,} tokens in {run['seconds']:.1f} s")
    return figures


def distinct_ngrams(texts: list[list[int]], n: int = 4) -> float:
    """Distinct n-grams / n-grams over ``texts``: 1.0 never repeats, near 0 loops."""
    grams = [tuple(t[i : i + n]) for t in texts for i in range(len(t) - n + 1)]
    return round(len(set(grams)) / len(grams), 4) if grams else 0.0


def sequences(work: Work) -> tuple[list[list[int]], int]:
    data = json.loads((work.root / "sequences.json").read_text())
    return data["sequences"], data["prompt_tokens"]


def save_sample(path: Path, ids, states: list, prompt_tokens: int) -> None:
    """One sequence as speculators' data script saves it; the loss on the response only."""
    import torch

    mask = torch.ones_like(ids)
    mask[:prompt_tokens] = 0
    torch.save({"input_ids": ids, "hidden_states": [h.contiguous() for h in states], "loss_mask": mask}, path)


def step_capture(work: Work) -> dict:
    """speculators' generator (its default layer ids) on every sequence."""
    import torch
    from speculators.data_generation import VllmHiddenStatesGenerator

    seqs, prompt_tokens = sequences(work)
    datadir = work.root / "data-vllm"
    datadir.mkdir(exist_ok=True)
    t = time.time()
    generator = VllmHiddenStatesGenerator(
        str(work.verifier), layer_ids=None, max_model_len=512, gpu_memory_utilization=_generator_memory(work.device)
    )
    started = time.time() - t
    layers = list(generator.layer_ids)
    if len(set(layers)) != len(layers):
        generator.executor.shutdown()
        raise RuntimeError(f"the generator's default layer ids {layers} repeat a layer: the verifier is too shallow")
    t = time.time()
    try:
        batch = work.settings["capture_batch"]
        for start in range(0, len(seqs), batch):
            for i, result in enumerate(generator.generate(seqs[start : start + batch])):
                if result["input_ids"].tolist() != seqs[start + i]:
                    raise RuntimeError(f"sequence {start + i}: the generator returned other tokens")
                save_sample(
                    datadir / f"data_{start + i}.pt", result["input_ids"], result["hidden_states"], prompt_tokens
                )
        config_said = write_data_config(generator, datadir, len(seqs))
    finally:
        generator.executor.shutdown()
    figures = {
        "layer_ids": layers,
        "data_config": config_said,
        "files": len(seqs),
        "tokens": sum(map(len, seqs)),
        "engine_start_s": round(started, 1),
        "capture_s": round(time.time() - t, 1),
        "dtype": str(torch.load(datadir / "data_0.pt", weights_only=True)["hidden_states"][0].dtype),
    }
    log(f"captured layers {layers} of {len(seqs)} sequences with speculators' generator ({figures['capture_s']} s)")
    return figures


def write_data_config(generator, datadir: Path, samples: int) -> str:
    """``data_config.json`` beside the data, as speculators' data-generation script writes it
    (``DataGenerationConfig.from_generator``): it names the layers the data holds, which the
    patched trainer records in the draft's config (SP035). Returns what was written."""
    from speculators.data_generation.config_generator import DataGenerationConfig

    config = DataGenerationConfig.from_generator(
        generator, train_data_path="responses", seq_length=512, cache_dir=str(datadir), num_samples=samples
    )
    (datadir / "data_config.json").write_text(json.dumps(config.to_dict(), indent=2))
    return f"data_config.json, hidden_states.layer_ids {config.hidden_states.layer_ids}"


def _generator_memory(device: str) -> float:
    """selftest's share: about 8 GiB of the GPU (patcher/agent/selftest/run.py)."""
    if device == "cpu":
        return 0.8
    import torch

    return min(0.9, (8 << 30) / torch.cuda.mem_get_info(0)[1])


def step_capture_hf(work: Work) -> dict:
    """transformers' forward of the same sequences, same layers, bf16 on the same device."""
    import torch
    from transformers import AutoModelForCausalLM

    seqs, prompt_tokens = sequences(work)
    layers = work.figures("capture")["layer_ids"]
    datadir = work.root / "data-hf"
    datadir.mkdir(exist_ok=True)
    shutil.copy(work.root / "data-vllm" / "data_config.json", datadir)  # the same layers, captured again
    model = AutoModelForCausalLM.from_pretrained(work.verifier, dtype=torch.bfloat16).to(work.device).eval()
    last = model.config.num_hidden_layers - 1
    seen: dict = {}
    model.model.layers[last].register_forward_hook(lambda _m, _a, out: seen.__setitem__("last", _first(out)))
    stats = Comparison(layers)
    t = time.time()
    with torch.no_grad():
        for start in range(0, len(seqs), 64):
            ids = torch.tensor(seqs[start : start + 64], device=work.device)
            out = model(ids, output_hidden_states=True)
            for row in range(ids.shape[0]):
                states = [(seen["last"] if i == last else out.hidden_states[i + 1])[row].cpu() for i in layers]
                save_sample(datadir / f"data_{start + row}.pt", ids[row].cpu(), states, prompt_tokens)
                stats.add(work.root / "data-vllm" / f"data_{start + row}.pt", states)
            stats.targets(model, seen["last"], out.logits, prompt_tokens)
    figures = stats.figures()
    figures["seconds"] = round(time.time() - t, 1)
    log(
        "vLLM vs transformers capture, worst per-token cosine per layer: "
        + ", ".join(f"{layer}: {c['worst']:.5f}" for layer, c in zip(layers, figures["cosine"], strict=True))
    )
    log(
        f"speculators 0.3.0's training target (LM head, no final norm) picks the verifier's own next token at "
        f"{figures['target_agreement']:.4f} of response positions"
    )
    return figures


def _first(out):
    return out[0] if isinstance(out, tuple) else out


class Comparison:
    """Per layer the per-token cosine of the vLLM capture to the transformers one (worst,
    mean), and how often argmax(LM head(last hidden state)) -- speculators 0.3.0's target,
    without the verifier's final norm -- equals the verifier's own argmax on the response."""

    def __init__(self, layers: list[int]) -> None:
        self.layers = layers
        self.worst = [1.0] * len(layers)
        self.sums = [0.0] * len(layers)
        self.tokens = 0
        self.agree = self.positions = 0

    def add(self, vllm_file: Path, states: list) -> None:
        import torch

        theirs = torch.load(vllm_file, weights_only=True)["hidden_states"]
        for i, (a, b) in enumerate(zip(theirs, states, strict=True)):
            cos = torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)
            self.worst[i] = min(self.worst[i], cos.min().item())
            self.sums[i] += cos.sum().item()
        self.tokens += states[0].shape[0]

    def targets(self, model, last_hidden, logits, prompt_tokens: int) -> None:
        with_norm = logits[:, prompt_tokens - 1 : -1].argmax(-1)
        without = model.lm_head(last_hidden[:, prompt_tokens - 1 : -1]).argmax(-1)
        self.agree += (with_norm == without).sum().item()
        self.positions += with_norm.numel()

    def figures(self) -> dict:
        return {
            "layers": self.layers,
            "cosine": [
                {"worst": round(w, 6), "mean": round(s / self.tokens, 6)}
                for w, s in zip(self.worst, self.sums, strict=True)
            ],
            "target_agreement": self.agree / self.positions,
            "target_positions": self.positions,
        }


# --- training ----------------------------------------------------------------------------


def step_train(work: Work) -> dict:
    """The vocabulary mapping, the untrained draft, then a draft trained on each capture; on
    a GPU for at most ``train_seconds``: a draft stopped then keeps its finished epochs and is
    resumed by the next call (``incomplete``)."""
    import torch

    text = work.config()
    shutil.rmtree(work.root / "served", ignore_errors=True)  # copies of drafts trained before
    mapping = vocab_mapping(work, text["vocab_size"])
    if not (work.root / "drafts" / "untrained").is_dir():
        untrained = draft_model(work, text, mapping)
        from speculators.train.checkpointer import SingleGPUCheckpointer

        SingleGPUCheckpointer(work.root / "drafts" / "untrained").save_checkpoint(
            untrained, torch.optim.AdamW(untrained.parameters()), 0
        )
    specs = [
        {"workdir": str(work.root), "size": work.size, "device": work.device, "name": name, "settings": work.settings}
        for name in trained_drafts(work)
    ]
    done = {s["name"]: work.root / "drafts" / s["name"] / "result.json" for s in specs}
    todo = [s for s in specs if not done[s["name"]].is_file() or json.loads(done[s["name"]].read_text())["stopped"]]
    for s in todo:
        done[s["name"]].unlink(missing_ok=True)
    budget = work.settings["train_seconds"] if work.device == "cuda" else None
    workers = max(2, min(LOADER_WORKERS, (os.cpu_count() or 4) // max(1, len(todo)) - 2))
    for s in todo:
        s["deadline"] = None if budget is None else time.time() + budget
        s["workers"] = workers if work.device == "cuda" else 0
    log(
        f"training {', '.join(s['name'] for s in todo) or 'nothing'} (logs: {work.root / 'logs'}/train-*.log"
        + (f"; stopped after {budget} s" if budget else "")
        + ")"
    )
    run_children(
        [["--train-one", json.dumps(s)] for s in todo],
        parallel=work.device == "cuda",
        logs=[work.root / "logs" / f"train-{s['name']}.log" for s in todo],
        timeout=budget,
    )
    figures = {"vocab": mapping["figures"], "drafts": {}}
    for spec in specs:
        name = spec["name"]
        if not done[name].is_file() and saved_epochs(work.root / "drafts" / name):
            done[name].write_text(json.dumps(draft_result(work, name, work.settings, stopped=True), indent=1))
        result = json.loads(done[name].read_text()) if done[name].is_file() else _failed(work, name)
        figures["drafts"][name] = result
        if "error" in result:
            raise RuntimeError(f"training the {name} draft failed:\n" + "\n".join(result["tail"]))
        log(
            f"{name} draft: {result['steps']} steps, {result['epochs_done']} of {result['epochs']} epochs"
            + (" (stopped at the time budget: the next train call resumes it)" if result["stopped"] else "")
            + f", loss {result['loss_first']:.4f} -> {result['loss_last']:.4f}, accuracy per TTT step "
            f"{result['accuracy']}, {result['seconds_per_step']} s per step"
        )
    figures["incomplete"] = any(d["stopped"] for d in figures["drafts"].values())
    recorded = json.loads((draft_checkpoint(work, "vllm") / "config.json").read_text())
    figures["recorded_aux_ids"] = recorded.get("eagle_aux_hidden_state_layer_ids")
    return figures


def trained_drafts(work: Work) -> list[str]:
    """The ``DRAFTS`` this run trains and serves (``--drafts``; all by default)."""
    return work.settings.get("drafts") or list(DRAFTS)


def vocab_mapping(work: Work, vocab: int) -> dict:
    """speculators' mapping from the token counts of the responses (loss mask 1), as its
    ``save_token_frequency_distribution`` counts them; saved to ``vocab.pt``."""
    from collections import Counter

    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    path = work.root / "vocab.pt"
    if path.is_file():
        return torch.load(path, weights_only=False)
    freq: Counter = Counter()
    for f in sorted((work.root / "data-vllm").glob("*.pt")):
        data = torch.load(f, weights_only=True)
        freq.update(data["input_ids"][data["loss_mask"].bool()].tolist())
    d2t, t2d = build_vocab_mappings_from_distribution(dict(freq), vocab - DRAFT_VOCAB_SHORT_BY, vocab)
    covered = sum(n for tok, n in freq.items() if t2d[tok])
    mapping = {
        "d2t": d2t,
        "t2d": t2d,
        "figures": {
            "draft_vocab": int(t2d.sum()),
            "verifier_vocab": vocab,
            "response_tokens_covered": covered / sum(freq.values()),
        },
    }
    torch.save(mapping, path)
    return mapping


def draft_config(work: Work, text: dict, layer_ids=None):
    """``Eagle3SpeculatorConfig`` over a one-layer Llama of the verifier's widths, as
    speculators 0.3.0's ``scripts/train.py`` builds it (no ``eagle_aux_hidden_state_layer_ids``:
    the patched install may record them, ``serve`` writes or removes them per variant)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layer = LlamaConfig(
        vocab_size=text["vocab_size"],
        hidden_size=text["hidden_size"],
        intermediate_size=text["intermediate_size"],
        num_hidden_layers=1,
        num_attention_heads=text["num_attention_heads"],
        num_key_value_heads=text["num_key_value_heads"],
        max_position_embeddings=text["max_position_embeddings"],
        rms_norm_eps=text["rms_norm_eps"],
        head_dim=text["hidden_size"] // text["num_attention_heads"],
    )
    layer._attn_implementation = "simple_flex_attention"
    return Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=text["vocab_size"] - DRAFT_VOCAB_SHORT_BY,
        norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(work.verifier), architectures=["LlamaForCausalLM"]),
        ),
    )


def draft_model(work: Work, text: dict, mapping: dict):
    """The draft with seeded weights: the same start for every draft of the run."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    torch.manual_seed(0)
    return Eagle3DraftModel(config=draft_config(work, text), t2d=mapping["t2d"], d2t=mapping["d2t"])


def train_one(spec: dict) -> dict:
    """One draft of ``DRAFTS`` (``spec["name"]``): speculators' dataset, packing sampler and
    ``Trainer`` on a GPU, resumed from its newest saved epoch; on a CPU the forward and the
    checkpointer's save. Every step's metrics go to ``steps.jsonl`` as they come; returns
    ``draft_result``."""
    work = Work(Path(spec["workdir"]), spec["size"], spec["device"])
    work.settings.update(spec["settings"])
    settings = work.settings
    data, normed = DRAFTS[spec["name"]]
    mapping = vocab_mapping(work, work.config()["vocab_size"])
    model = draft_model(work, work.config(), mapping)
    files = sorted((work.root / f"data-{data}").glob("*.pt"))
    val_files = files[VAL_EVERY - 1 :: VAL_EVERY]
    train_files = [f for i, f in enumerate(files) if i % VAL_EVERY != VAL_EVERY - 1]
    norm = [final_norm(work)] if normed else []
    workers = spec.get("workers", 0)
    loader = data_loader(train_files, settings["pack"], [*norm, noise()], workers)
    val_loader = data_loader(val_files, settings["pack"], norm, min(workers, 2))
    save_path = work.root / "drafts" / spec["name"]
    log_file = StepLog(save_path / "steps.jsonl")
    if work.device == "cuda":
        settings["epochs"] = planned_epochs(model, loader, val_loader, save_path, settings, spec.get("deadline"))
        trainer(model, loader, val_loader, save_path, settings, log_file)
    else:
        forward_only(model, loader, val_loader, save_path, settings["ttt"], log_file)
    result = draft_result(work, spec["name"], settings, stopped=False)
    (save_path / "result.json").write_text(json.dumps(result, indent=1))  # last: the draft is complete
    return result


class StepLog:
    """A draft's training record, one JSON line per event, written as it happens (a draft
    stopped at the time budget keeps it): ``{"epoch", "step_s", <speculators' metrics>}`` per
    optimizer step (``step_s``: seconds since the step before in this process, None for a
    process's first), ``{"saved": epoch}`` once the checkpointer has saved an epoch."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.last: float | None = None

    def entries(self) -> list[dict]:
        return [json.loads(x) for x in self.path.read_text().splitlines()] if self.path.is_file() else []

    def keep_epochs_before(self, epoch: int) -> None:
        """Drop what a stopped run logged of ``epoch`` and later: they are trained again."""
        kept = [e for e in self.entries() if e.get("epoch", e.get("saved", e.get("val", 0))) < epoch]
        self.path.write_text("".join(json.dumps(e) + "\n" for e in kept))

    def step(self, epoch: int, metrics: dict) -> None:
        now = time.perf_counter()
        entry = {"epoch": epoch, "step_s": None if self.last is None else round(now - self.last, 4), **metrics}
        self.last = now
        self._write(entry)

    def val(self, epoch: int, metrics: dict) -> None:
        self._write({"val": epoch, **metrics})

    def saved(self, epoch: int) -> None:
        self._write({"saved": epoch})

    def _write(self, entry: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")


def saved_epochs(save_path: Path) -> list[int]:
    """The epochs whose checkpoint the step log says was saved whole."""
    return [e["saved"] for e in StepLog(save_path / "steps.jsonl").entries() if "saved" in e]


def draft_result(work: Work, name: str, settings: dict, stopped: bool) -> dict:
    """A draft's figures from its step log, over the epochs saved whole: steps, epochs done of
    ``epochs``, loss first -> last (means of 20 steps), the accuracy per TTT step speculators
    logs (``full_acc_i``, mean of the last 50 steps), the median seconds per step and their
    sum; ``stopped``: the time budget ended the run before its last epoch."""
    import torch

    save_path = work.root / "drafts" / name
    epochs_done = len(saved_epochs(save_path))
    entries = StepLog(save_path / "steps.jsonl").entries()
    steps = [e for e in entries if e.get("epoch", epochs_done) < epochs_done]
    vals = [e for e in entries if e.get("val", epochs_done) < epochs_done]
    plan = json.loads((save_path / "plan.json").read_text()) if (save_path / "plan.json").is_file() else {}
    last = steps[-50:]
    timed = sorted(e["step_s"] for e in steps if e["step_s"] is not None)
    return {
        "steps": len(steps),
        "ttt_steps": settings["ttt"],
        "epochs": plan.get("epochs", settings["epochs"]) if work.device == "cuda" else 0,
        "planned_from": plan,
        "epochs_done": epochs_done if work.device == "cuda" else 0,
        "stopped": stopped,
        "lr": settings["lr"],
        "pack": settings["pack"],
        "loss_first": sum(s["loss"] for s in steps[:20]) / len(steps[:20]),
        "loss_last": sum(s["loss"] for s in steps[-20:]) / len(steps[-20:]),
        "accuracy": [round(sum(s[f"full_acc_{i}"] for s in last) / len(last), 4) for i in range(settings["ttt"])],
        # the held-out tenth, after the last epoch saved: what serving should come near
        "val_accuracy": [round(vals[-1][f"full_acc_{i}_epoch"], 4) for i in range(settings["ttt"])] if vals else None,
        "val_loss": round(vals[-1]["loss_epoch"], 4) if vals else None,
        "seconds_per_step": timed[len(timed) // 2] if timed else None,
        "seconds": round(sum(timed), 1),
        "checkpoint": str(save_path / str(max(saved_epochs(save_path)))),
        "torch": torch.__version__,
    }


def data_loader(files: list[Path], pack: int, transforms: list, workers: int = 0):
    """speculators' dataset (``transforms`` applied to each sample in turn), packing sampler and
    collate function over ``files``, loaded as 0.3.0's ``scripts/train.py`` loads them: by
    ``workers`` processes (none: in this one), prefetch 4, pinned memory on a GPU."""
    import torch
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    def transform(sample: dict) -> dict:
        for fn in transforms:
            sample = fn(sample)
        return sample

    dataset = Eagle3SampleFileDataset(
        max_len=pack,
        file_list=[str(f) for f in files],
        hidden_states_dtype=torch.float32,
        transform=transform if transforms else None,
    )
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=pack, lengths=dataset.approx_lengths, num_replicas=1, rank=0
    )
    parallel = {"prefetch_factor": 4, "persistent_workers": True} if workers else {}
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=create_collate_fn(pack),
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),
        **parallel,
    )


def noise():
    """0.3.0's training noise: ``AddUniformNoise`` of half-width ``NOISE_STD`` on the hidden
    states and the verifier's last ones (``speculators.train.noise_transforms``)."""
    from speculators.train.noise_transforms import AddUniformNoise

    return AddUniformNoise(std=NOISE_STD, tensors=("hidden_states", "verifier_last_hidden_states"))


def planned_epochs(model, loader, val_loader, save_path: Path, settings: dict, deadline: float | None) -> int:
    """The epochs this draft trains, fitted to the time left before ``deadline`` (seconds since
    the epoch; None: ``settings["epochs"]``): ``CALIBRATION_STEPS`` optimizer steps and two
    validation batches are run on ``model`` (which compiles speculators' ``@torch.compile``
    forward for both), timed, and its weights put back; then as many epochs as fit with
    ``BUDGET_SLACK`` to spare, at least 1, at most ``settings["epochs"]``. Kept in ``plan.json``:
    a resumed draft trains to the same schedule."""
    import copy

    import torch

    plan_file = save_path / "plan.json"
    if plan_file.is_file():
        return json.loads(plan_file.read_text())["epochs"]
    if deadline is None:
        return settings["epochs"]
    start = copy.deepcopy(model.state_dict())
    model.to("cuda").train()
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)  # steps that change nothing but are timed
    untimed, timed = CALIBRATION_STEPS
    batches = (batch for _ in range(untimed + timed) for batch in loader)  # a short loader goes round again
    for i in range(untimed + timed):
        if i == untimed:
            torch.cuda.synchronize()
            t = time.perf_counter()
        batch = {k: v.to("cuda", non_blocking=True) for k, v in next(batches).items()}
        _, loss, _ = model(**batch, ttt_steps=settings["ttt"])
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t) / timed
    model.eval()
    with torch.no_grad():
        for batch, _ in zip(val_loader, range(2), strict=False):
            model(**{k: v.to("cuda") for k, v in batch.items()}, ttt_steps=settings["ttt"])
    model.load_state_dict(start)
    epoch_s = step_s * (len(loader) + len(val_loader) / 3) + 2  # validation: forward only; 2 s: the save
    left = (deadline - time.time()) * (1 - BUDGET_SLACK)
    epochs = max(1, min(settings["epochs"], int(left // epoch_s)))
    plan = {"epochs": epochs, "seconds_per_step": round(step_s, 4), "steps_per_epoch": len(loader)}
    plan_file.parent.mkdir(parents=True, exist_ok=True)
    plan_file.write_text(json.dumps(plan | {"seconds_left": round(left, 1), "epoch_s": round(epoch_s, 1)}))
    print(f"planned {epochs} epochs: {plan}", flush=True)
    return epochs


def final_norm(work: Work):
    """A dataset transform: the verifier's last hidden state through its final RMSNorm
    (``model.norm.weight``, ``rms_norm_eps``), so that the draft's target is the verifier's own
    distribution, as speculators 0.4 computes it; 0.3.0 trains on the LM head of the state
    without that norm (``Eagle3DraftModel.forward``: ``verifier_lm_head(verifier_last_hidden_states)``)."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(str(work.verifier / "model.safetensors"))
    weight, eps = weights["model.norm.weight"].float(), work.config()["rms_norm_eps"]

    def transform(sample: dict) -> dict:
        h = sample["verifier_last_hidden_states"].float()
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight
        return {**sample, "verifier_last_hidden_states": normed}

    return transform


def trainer(model, loader, val_loader, save_path: Path, settings: dict, step_log: StepLog) -> None:
    """speculators' ``Trainer`` (linear schedule, 1 % warm-up, its defaults), resumed from the
    newest epoch the step log says was saved whole (a checkpoint a stopped run left half
    written is removed first); every step and every saved epoch logged."""
    import logging

    from speculators.train.trainer import Trainer, TrainerConfig

    whole = saved_epochs(save_path)
    for partial in (d for d in save_path.iterdir() if d.name.isdigit() and int(d.name) not in whole):
        shutil.rmtree(partial)

    class Metrics(logging.Handler):
        def emit(self, record):
            if isinstance(record.msg, dict) and "train" in record.msg:
                step_log.step(record.msg["epoch"], record.msg["train"])
            elif isinstance(record.msg, dict) and "val" in record.msg:
                step_log.val(record.msg["epoch"], record.msg["val"])
            elif isinstance(record.msg, str) and record.msg.startswith("Finished saving checkpoint to "):
                step_log.saved(int(Path(record.msg.rsplit(" ", 1)[1]).name))

    # one handler, on the parent: "speculators.metrics" (the steps) propagates to it
    logging.getLogger("speculators").addHandler(Metrics())
    for name in ("speculators.metrics", "speculators"):
        logging.getLogger(name).setLevel(logging.INFO)
    kwargs = {"ttt_steps": settings["ttt"]}
    config = TrainerConfig(
        lr=settings["lr"],
        num_epochs=settings["epochs"],
        save_path=str(save_path),
        resume_from_checkpoint=True,
        train_call_kwargs=kwargs,
        val_call_kwargs=kwargs,
    )
    run = Trainer(model, config, loader, val_loader)
    step_log.keep_epochs_before(run.current_epoch)
    print(f"training epochs {run.current_epoch + 1}..{settings['epochs']} of {settings['epochs']}", flush=True)
    run.run_training()


def forward_only(model, loader, val_loader, save_path: Path, ttt: int, step_log: StepLog) -> None:
    """CPU: no backward through FlexAttention there; the training forward on the first
    batch and the validation forward on the first held-out one (eager), and the
    checkpointer's save of the draft."""
    import torch
    from speculators.train.checkpointer import SingleGPUCheckpointer

    step_log.keep_epochs_before(0)
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        _, loss, metrics = model(**next(iter(loader)), ttt_steps=ttt)
        step_log.step(0, {k: float(v) for k, v in metrics.items()} | {"loss": loss.item()})
        _, loss, metrics = model(**next(iter(val_loader)), ttt_steps=ttt)
        step_log.val(0, {f"{k}_epoch": float(v) for k, v in metrics.items()} | {"loss_epoch": loss.item()})
    SingleGPUCheckpointer(save_path).save_checkpoint(model, torch.optim.AdamW(model.parameters()), 0)
    step_log.saved(0)


def draft_checkpoint(work: Work, draft: str) -> Path:
    """The checkpoint a draft is served from: the untrained draft's, or the last epoch a
    trained one saved whole (its ``result.json``). Raises RuntimeError for a draft the train
    step has not trained."""
    if draft == "untrained":
        return newest(work.root / "drafts" / draft)
    result = work.root / "drafts" / draft / "result.json"
    if not result.is_file():
        raise RuntimeError(f"the {draft} draft has no training result ({result}): run the train step first")
    return Path(json.loads(result.read_text())["checkpoint"])


def newest(checkpoints: Path) -> Path:
    return max((d for d in checkpoints.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))


def run_children(arg_lists: list[list[str]], parallel: bool, logs: list[Path], timeout: float | None = None) -> None:
    """This script in child processes (one per argument list, its output to the matching
    file of ``logs``, each in its own process group), all at once or in turn, until each has
    exited or ``timeout`` seconds have passed since the first started: then every one still
    running is killed with its process group."""

    procs = []
    deadline = None if timeout is None else time.monotonic() + timeout
    for args, path in zip(arg_lists, logs, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
        if not parallel:
            _wait(procs[-1], deadline)
    for proc in procs:
        _wait(proc, deadline)


def _wait(proc: subprocess.Popen, deadline: float | None) -> None:
    """Wait for ``proc``; past ``deadline``, kill its process group (its own children too)."""
    import signal

    try:
        proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _failed(work: Work, name: str) -> dict:
    """A draft whose child wrote no result: its log's last lines."""
    text = (work.root / "logs" / f"train-{name}.log").read_text(errors="replace")
    return {"error": "no result", "tail": [x for x in text.splitlines() if x.strip()][-30:]}


# --- serving -----------------------------------------------------------------------------


def _request(work: Work, name: str, draft: str | None, k: int) -> dict:
    return {"name": name, "verifier": str(work.verifier), "draft": draft, "k": k, "device": work.device}


def served_draft(work: Work, draft: str, ids: str) -> str:
    """A copy of the newest checkpoint of ``draft``. ``ids``: its config keeps the
    ``eagle_aux_hidden_state_layer_ids`` the install recorded (SP035 records the data's layers
    + 1) or, where it recorded none, gets the captured layers + 1 written; ``no-ids``: none,
    what unpatched speculators 0.3.0 saves. Where it keeps them, it says so in ``aux_ids.txt``."""
    target = work.root / "served" / f"{draft}-{ids}"
    if not target.is_dir():
        shutil.copytree(draft_checkpoint(work, draft), target)
        config_file = target / "config.json"
        config = json.loads(config_file.read_text())
        recorded = config.pop("eagle_aux_hidden_state_layer_ids", None)
        if ids == "ids":
            config["eagle_aux_hidden_state_layer_ids"] = recorded or trained_ids(work)
            (target / "aux_ids.txt").write_text("recorded by the install" if recorded else "written by the benchmark")
        config_file.write_text(json.dumps(config, indent=2))
    return str(target)


def trained_ids(work: Work) -> list[int]:
    """The auxiliary layers the drafts were trained on, in vLLM's numbering: the generator's
    layer ids but the last (the verifier's last hidden state), + 1."""
    return [i + 1 for i in work.figures("capture")["layer_ids"][:-1]]


def step_serve(work: Work) -> dict:
    """Every variant of ``SERVED`` in its own engine, greedy, on the held-out prompts; a second
    call serves again only the variants whose engine failed (``incomplete``)."""
    serve = serve_module()
    before = (work.figures("serve") or {}).get("served", {})
    chosen = [name for name in SERVED if SERVED[name][0] in (None, "untrained", *trained_drafts(work))]
    todo = [name for name in chosen if name not in before or "error" in before[name]]
    turns = work.root / "serve-turns"
    shutil.rmtree(turns, ignore_errors=True)
    parallel = work.device == "cuda"
    requests = [serve_request(work, name, str(turns) if parallel else None, len(todo)) for name in todo]
    t = time.time()
    limit = SERVE_TIMEOUT if parallel else 3600  # the CPU serves one engine after the other
    results = serve.serve_all(requests, parallel=parallel, log=work.root / "logs", timeout=limit)
    baseline_file = work.root / "verifier-alone-outputs.json"
    for name, result in zip(todo, results, strict=True):
        if SERVED[name][0] is None and "error" not in result:
            baseline_file.write_text(json.dumps(result["runs"][0]["outputs"]))
    baseline = json.loads(baseline_file.read_text()) if baseline_file.is_file() else None
    found = {
        name: summarize_served(result, baseline, served_layers(work, request["draft"]))
        for name, result, request in zip(todo, results, requests, strict=True)
    }
    figures = {
        "seconds": round(time.time() - t, 1),
        "served": {name: found.get(name) or before[name] for name in chosen},
    }
    for name in todo:
        log(f"{name}: {json.dumps(found[name])}")
    figures["incomplete"] = any("error" in x for x in figures["served"].values())
    return figures


def serve_request(work: Work, name: str, turns: str | None, group: int) -> dict:
    """The ``spec_decode`` request of one ``SERVED`` variant: greedy on the held-out prompts,
    then ``single_stream`` of them one at a time; timed in turn with its ``group``."""
    draft, ids, k, one_stream = SERVED[name]
    request = _request(work, name.replace(" ", "_").replace(",", "").replace("=", ""), None, k)
    request["draft"] = served_draft(work, draft, ids) if draft else None
    request["runs"] = [
        {
            "name": "held-out prompts",
            "prompts": work.prompts()["heldout"],
            "max_tokens": work.settings["serve_tokens"],
            "single_stream": work.settings["single_stream"] if one_stream else 0,
        }
    ]
    if turns:
        request.update(turns=turns, group=group)
    return request


def summarize_served(result: dict, baseline: list | None, aux: str) -> dict:
    """One engine's figures for the report; ``aux``: the auxiliary layers it served."""
    if "error" in result:
        return {"error": result["error"], "tail": result["tail"], "aux_layers": aux}
    run = result["runs"][0]
    outputs = run.pop("outputs")
    spec = run["spec_decode"]

    def rounded(x):
        return None if x is None else round(x, 4)

    return {
        "acceptance_length": rounded(spec["acceptance_length"]),
        "per_position": spec["per_position"],
        "acceptance_rate": rounded(spec["acceptance_rate"]),
        "drafts": spec["drafts"],
        "accepted": spec["accepted"],
        "aux_layers": aux,
        "tokens_per_s": run["tokens_per_s"],
        "single_stream_tokens_per_s": run.get("single_stream", {}).get("tokens_per_s"),
        "same_output_as_verifier_alone": sum(a == b for a, b in zip(outputs, baseline, strict=True))
        if baseline
        else None,
        "prompts": run["prompts"],
        "output_tokens": run["output_tokens"],
        "distinct_4grams": distinct_ngrams(outputs),
        "engine_start_s": result["engine_start_s"],
    }


def served_layers(work: Work, draft: str | None) -> str:
    """The auxiliary layers vLLM serves a draft directory: its config's ids, else vLLM's
    default for this verifier (models/interfaces.py ``get_eagle3_default_aux_hidden_state_layers``:
    2, n/2, n-3, in vLLM's numbering)."""
    if not draft:
        return "-"
    ids = json.loads((Path(draft) / "config.json").read_text()).get("eagle_aux_hidden_state_layer_ids")
    if ids:
        said = (Path(draft) / "aux_ids.txt").read_text()
        trained = "" if ids == trained_ids(work) else f", NOT the trained {trained_ids(work)}"
        return f"{ids} ({said}{trained})"
    n = work.config()["num_hidden_layers"]
    return f"{[2, n // 2, n - 3]} (vLLM's default)"


# --- report ------------------------------------------------------------------------------


def step_report(work: Work, out_dir: Path | None) -> dict:
    report = {step: work.figures(step) for step in STEPS[:-1]}
    report["verdicts"] = verdicts(report)
    text = render(report)
    (work.root / "report.md").write_text(text)
    (work.root / "report.json").write_text(json.dumps(report, indent=1))
    print(text, flush=True)
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in ("report.md", "report.json"):
            shutil.copy(work.root / name, out_dir / name)
    return report["verdicts"]


def verdicts(report: dict) -> dict:
    """The issue's Done-when figures: acceptance length at k=3 >= 2.5 (floor 2.1), untrained
    about 1, the transformers-captured draft within 3 %, the draft without ids."""
    served = (report.get("serve") or {}).get("served", {})

    def length(name):
        return (served.get(name) or {}).get("acceptance_length")

    trained, hf = length("vLLM capture, k=3"), length("transformers capture, k=3")
    found = {
        "acceptance_length_k3": trained,
        "target_2_5": trained is not None and trained >= 2.5,
        "floor_2_1": trained is not None and trained >= 2.1,
        "untrained_k3": length("untrained, k=3"),
        "transformers_capture_k3": hf,
        "vllm_vs_transformers": (trained - hf) / hf if trained and hf else None,
        "within_3_percent": bool(trained and hf and abs(trained - hf) / hf <= 0.03),
        "no_ids_k3": length("vLLM capture, no ids, k=3"),
    }
    return found


def render(report: dict) -> str:
    """The report as Markdown: the verifier, the data, the drafts' training, the serving table
    and the issue's figures."""
    lines = ["# speculators 0.3.0's EAGLE-3 pipeline on a verifier that has learned real text", ""]
    lines += _render_verifier(report.get("verifier")) + _render_data(report) + _render_training(report.get("train"))
    lines += _render_serving((report.get("serve") or {}).get("served", {}))
    v = report.get("verdicts") or {}
    lines += [
        "",
        f"- acceptance length, vLLM capture, k=3: {v.get('acceptance_length_k3')} (target >= 2.5: "
        f"{v.get('target_2_5')}; floor 2.1: {v.get('floor_2_1')}); untrained: {v.get('untrained_k3')}",
        f"- transformers capture, k=3: {v.get('transformers_capture_k3')}; vLLM capture relative to it: "
        f"{v.get('vllm_vs_transformers')} (within 3 %: {v.get('within_3_percent')})",
        f"- no aux ids in the draft (unpatched 0.3.0's config, vLLM's default layers), k=3: {v.get('no_ids_k3')}",
        "",
    ]
    return "\n".join(lines)


def _render_verifier(v: dict | None) -> list[str]:
    if not v:
        return []
    c, h, t = v["corpus"], v["heldout"], v["training"]
    return [
        f"- verifier: Llama {v['model']['layers']} layers x {v['model']['hidden']}, "
        f"{v['model']['parameters']:,} parameters, {v['tokenizer']['kind']} of {v['tokenizer']['vocab']} tokens "
        f"({v['device_name']}, {v['seconds']['total']} s)",
        f"- corpus: {c['name']}: {c['files']} files, {c['bytes']:,} bytes, sha256 {c['sha256']}; "
        f"{c['heldout_files']} files held out, {c.get('user_files', 0)} the user's text (the draft's prompts); "
        f"{v['tokens']['train']:,} tokens train the verifier",
        f"- training: {t['steps']} steps x {t['batch']} x {t['seq']} tokens ({t['seconds']} s), "
        f"loss {t['loss_first']:.3f} -> {t['loss_last']:.3f}; held-out loss {h['loss']:.4f} nats/token "
        f"(top-1 {h['top1']:.3f}, {h['tokens']:,} tokens)",
    ]


def _render_data(report: dict) -> list[str]:
    r, c, hf = report.get("responses"), report.get("capture"), report.get("capture-hf")
    lines = []
    if r:
        lines.append(
            f"- responses (vLLM, greedy): {r['sequences']} sequences, {r['response_tokens']:,} tokens, "
            f"distinct 4-grams {r['distinct_4grams']}"
        )
    if c:
        lines.append(
            f"- capture (speculators' generator, default layer ids {c['layer_ids']}): {c['files']} sequences, "
            f"{c['tokens']:,} tokens, engine start {c['engine_start_s']} s, capture {c['capture_s']} s"
        )
    if hf:
        cos = ", ".join(
            f"{layer}: {x['worst']:.5f} / {x['mean']:.6f}" for layer, x in zip(hf["layers"], hf["cosine"], strict=True)
        )
        lines.append(f"- vLLM vs transformers capture, per-token cosine worst / mean per layer: {cos}")
        lines.append(
            f"- speculators 0.3.0's target (LM head without the final norm) = the verifier's next token at "
            f"{hf['target_agreement']:.4f} of {hf['target_positions']:,} response positions"
        )
    return lines


def _render_training(t: dict | None) -> list[str]:
    if not t:
        return []
    vocab = t["vocab"]
    lines = [
        f"- draft vocabulary {vocab['draft_vocab']} of {vocab['verifier_vocab']} tokens, covering "
        f"{vocab['response_tokens_covered']:.4f} of the response tokens; aux ids the install recorded: "
        f"{t['recorded_aux_ids']}",
        "",
        "| draft | steps | epochs done | TTT steps | loss first -> last | accuracy per TTT step (last 50 steps) "
        "| validation: loss, accuracy per TTT step | s per step | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, d in t["drafts"].items():
        stopped = " (stopped: time budget)" if d["stopped"] else ""
        val = f"{d['val_loss']}, {d['val_accuracy']}" if d.get("val_accuracy") else "-"
        lines.append(
            f"| {name} | {d['steps']} | {d['epochs_done']} of {d['epochs']}{stopped} | {d['ttt_steps']} | "
            f"{d['loss_first']:.4f} -> {d['loss_last']:.4f} | {d['accuracy']} | {val} | {d['seconds_per_step']} | "
            f"{d['seconds']} |"
        )
    return lines


def _render_serving(served: dict) -> list[str]:
    lines = [
        "",
        "| served | aux layers | acceptance length | per position | draft steps | tokens/s (batch) "
        "| tokens/s (1 stream) | same output |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in served.items():
        if "error" in s:
            lines.append(f"| {name} | {s['aux_layers']} | failed: {s['error']} | | | | | |")
            continue
        lines.append(
            f"| {name} | {s['aux_layers']} | {s['acceptance_length'] or '-'} | {s['per_position'] or '-'} | "
            f"{s['drafts']} | {s['tokens_per_s']} | {s['single_stream_tokens_per_s'] or '-'} | "
            f"{s['same_output_as_verifier_alone']}/{s['prompts']} |"
        )
    return lines


# --- main --------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    steps = STEPS if args.steps == "all" else tuple(args.steps.split(","))
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        print(f"error: unknown step {', '.join(unknown)} (known: {', '.join(STEPS)})", file=sys.stderr)
        return 2
    serve = serve_module()
    os.environ.update({k: v for k, v in serve.ENV.items() if k not in os.environ})
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU default takes far more
    work = Work(Path(args.workdir), "tiny" if args.tiny else "full", device)
    if args.epochs is not None:
        work.settings["epochs"] = args.epochs
    if args.train_seconds is not None:
        work.settings["train_seconds"] = args.train_seconds
    work.settings["verifier_steps"] = args.verifier_steps
    if args.drafts:
        unknown = sorted(set(args.drafts.split(",")) - set(DRAFTS))
        if unknown:
            print(f"error: unknown draft {', '.join(unknown)} (known: {', '.join(DRAFTS)})", file=sys.stderr)
            return 2
        work.settings["drafts"] = args.drafts.split(",")
    runners = {
        "verifier": step_verifier,
        "responses": step_responses,
        "capture": step_capture,
        "capture-hf": step_capture_hf,
        "train": step_train,
        "serve": step_serve,
    }
    for step in steps:
        t = time.time()
        if step == "report":
            found = step_report(work, Path(args.out_dir) if args.out_dir else None)
            print(MARKER + json.dumps(found), flush=True)
            continue
        done = work.figures(step)
        if done is not None and not done.get("incomplete"):
            log(f"{step}: done before, kept ({work.root / (step + '.json')})")
            continue
        log(f"{step}: started")
        figures = runners[step](work)
        figures.setdefault("step_seconds", round(time.time() - t, 1))
        work.save(step, figures)
        log(f"{step}: done in {time.time() - t:.0f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--train-one":
        os.environ.setdefault("TQDM_DISABLE", "1")
        print(MARKER + json.dumps(train_one(json.loads(sys.argv[2]))), flush=True)
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/accept")
    parser.add_argument("--steps", default="all", help=f"comma-separated, of: {', '.join(STEPS)}; or all")
    parser.add_argument("--tiny", action="store_true", help="CPU-sized settings")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parser.add_argument("--out-dir", default=None, help="where report.md and report.json are copied")
    parser.add_argument("--epochs", type=int, default=None, help="the drafts' training epochs (default: SETTINGS)")
    parser.add_argument(
        "--train-seconds",
        type=float,
        default=None,
        help="GPU: stop the drafts' training after this long; the next train call resumes it (default: SETTINGS)",
    )
    parser.add_argument("--drafts", default=None, help=f"comma-separated, of: {', '.join(DRAFTS)} (default: all)")
    parser.add_argument("--verifier-steps", type=int, default=None, help="the verifier's steps (default: its SIZES)")
    sys.exit(main(parser.parse_args()))

"""selftest's serving stage: vLLM serves the EAGLE-3 draft the training stage just saved.

Runs under the target's interpreter after the training stage of one architecture, in the form
the README gives (``LLM(model=VERIFIER, speculative_config={"method": "eagle3", "model":
DRAFT, "num_speculative_tokens": 3})``), greedy, on ``PROMPTS`` seeded prompts of the tiny
verifier's vocabulary (``spec_decode``: one engine per process):

- the newest checkpoint the trainer saved, and a draft of the same config with seeded,
  untrained weights (saved by speculators' checkpointer), each in its own engine, both at
  once on a GPU;
- the draft's ``eagle_aux_hidden_state_layer_ids``: vLLM numbers an auxiliary hidden state by
  the decoder layer it enters (vllm/model_executor/models/llama.py ``_maybe_add_hidden_state(
  aux, idx + 1, ...)``), speculators' generator by the layer whose output it is, so a draft
  trained on layers L is served L + 1. Ids the config records must be those; a config with
  none gets them written (speculators 0.3.0 records none, and vLLM would serve its default
  layers instead, models/interfaces.py ``get_eagle3_default_aux_hidden_state_layers``).

Reported per draft, from vLLM's spec-decode counters: acceptance length (1 + accepted tokens
per draft step), acceptance per position, draft steps; whether both gave the same greedy text.
Passes when vLLM served every draft (draft steps ran), the ids are the trained layers', and on
a GPU the trained draft's acceptance length is above the untrained one's. On a CPU the stage
runs only when asked (``--serve``): nothing trains there (FlexAttention has no backward), so it
serves the saved draft alone, to prove that vLLM's CPU engine loads and runs it.
"""

from __future__ import annotations

import json
import random
import time
import traceback
from pathlib import Path

from . import spec_decode, worker_log

PROMPTS, PROMPT_TOKENS, MAX_TOKENS = 32, 16, 48
SPECULATIVE_TOKENS = 3
KV_CACHE_BYTES = 1 << 30  # per engine on a GPU; the tiny verifier needs far less
NOT_ON_CPU = "on the CPU only with --serve (nothing is trained there: FlexAttention has no backward on the CPU)"


def stage(arch: str, report: dict, model_dir: Path, device: str, asked: bool | None, progress) -> dict:
    """The serving stage of one architecture's ``report`` (after ``training``), or why it does
    not run (``skipped``: passes, unless asked for and impossible). ``asked``: ``--serve``
    (True), ``--no-serve`` (False) or neither (None: on a GPU only)."""
    training = report.get("training") or {}
    if asked is False:
        return {"skipped": "not asked (--no-serve)", "ok": True}
    if asked is None and device == "cpu":
        return {"skipped": NOT_ON_CPU, "ok": True}
    if "skipped" in training or not training.get("ok"):
        why = training.get("skipped") or "the training stage did not pass"
        return {"skipped": f"no draft to serve: {why}", "ok": "skipped" in training}
    found: dict = {"device": device, "speculative_tokens": SPECULATIVE_TOKENS, "seconds": {}}
    t0 = time.time()
    try:
        _serve(report, model_dir, device, found, progress)
    except Exception as exc:
        found["error"] = _error("serving", exc)
    found["seconds"]["total"] = round(time.time() - t0, 1)
    found["ok"] = "error" not in found and judge(found, device)
    progress(f"{arch}: serving: {'ok' if found['ok'] else 'FAILED'} in {found['seconds']['total']:.0f} s")
    return found


def _error(stage: str, exc: BaseException) -> dict:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {"stage": stage, "type": type(exc).__name__, "message": str(exc).strip(), "traceback": "".join(tb)[-4000:]}


def _serve(report: dict, model_dir: Path, device: str, found: dict, progress) -> None:
    workdir = model_dir.parent / f"{report['arch']}-training"
    trained = newest(workdir / "draft")
    ids = [i + 1 for i in report["layers"]]
    found["aux_layer_ids"] = aux_ids(trained, ids)
    drafts = {"trained": trained}
    if device == "cuda":
        drafts = {"untrained": untrained_copy(trained, workdir / "untrained"), **drafts}
    for draft in drafts.values():
        set_aux_ids(draft, found["aux_layer_ids"]["served"])
    vocab = verifier_vocab(model_dir)
    rng = random.Random(11)
    prompts = [[rng.randrange(4, vocab) for _ in range(PROMPT_TOKENS)] for _ in range(PROMPTS)]
    requests = [
        {
            "name": name,
            "verifier": str(model_dir),
            "draft": str(path),
            "k": SPECULATIVE_TOKENS,
            "device": device,
            "kv_cache_bytes": KV_CACHE_BYTES,
            "runs": [{"name": "prompts", "prompts": prompts, "max_tokens": MAX_TOKENS}],
        }
        for name, path in drafts.items()
    ]
    progress(
        f"{report['arch']}: serving: vLLM, EAGLE-3, {SPECULATIVE_TOKENS} speculative tokens, "
        f"{' and '.join(drafts)} draft{'s' if len(drafts) > 1 else ''}, aux layers {found['aux_layer_ids']['served']}"
    )
    results = spec_decode.serve_all(requests, parallel=device == "cuda", log=workdir / "serve-logs")
    found["drafts"] = {name: summary(result) for name, result in zip(drafts, results)}
    outputs = [r["runs"][0]["outputs"] for r in results if "error" not in r]
    if len(outputs) == 2:
        found["same_greedy_output"] = f"{sum(a == b for a, b in zip(*outputs))}/{PROMPTS}"
    failed = next((r for r in results if "error" in r), None)
    if failed is not None:
        found["error"] = engine_error(failed)


def verifier_vocab(model_dir: Path) -> int:
    """The verifier's vocabulary size from its ``config.json``: at the top, or in
    ``text_config`` where a vision-language wrapper (Kimi-K2.5's
    ``KimiK25ForConditionalGeneration``) keeps its language model's. Raises ``KeyError``
    where neither has one."""
    config = json.loads((model_dir / "config.json").read_text())
    return config["vocab_size"] if "vocab_size" in config else config["text_config"]["vocab_size"]


def engine_error(failed: dict) -> dict:
    """The error of an engine that did not serve: the last line it printed and, where a vLLM
    process logged one, that exception (``worker_log.worker_exception``: vLLM itself only says
    ``Engine core initialization failed``)."""
    tail = failed["tail"]
    error = {
        "stage": f"serving the {failed['name']} draft",
        "type": "EngineFailed",
        "message": tail[-1] if tail else failed["error"],
        "traceback": "\n".join(tail),
    }
    logged = worker_log.worker_exception(Path(failed["log"]).read_text(errors="replace"))
    if logged is not None:
        error["worker"] = logged
    return error


def newest(checkpoints: Path) -> Path:
    """The highest-numbered epoch directory the checkpointer wrote under ``checkpoints``."""
    return max((d for d in checkpoints.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))


def aux_ids(draft: Path, trained_on: list[int]) -> dict:
    """What the saved config records (``recorded``, None when nothing), what its data came
    from in vLLM's numbering (``trained_on``), what is served (``served``: the recorded ids
    when there are some, else ``trained_on``) and whether they agree (``match``)."""
    recorded = json.loads((draft / "config.json").read_text()).get("eagle_aux_hidden_state_layer_ids")
    served = list(recorded) if recorded else trained_on
    return {"recorded": recorded, "trained_on": trained_on, "served": served, "match": served == trained_on}


def set_aux_ids(draft: Path, ids: list[int]) -> None:
    path = draft / "config.json"
    config = json.loads(path.read_text())
    config["eagle_aux_hidden_state_layer_ids"] = ids
    path.write_text(json.dumps(config, indent=2))


def untrained_copy(trained: Path, where: Path) -> Path:
    """A draft of ``trained``'s config (and vocabulary mapping) with the weights it would
    start training from (seed 0), saved by speculators' checkpointer as epoch 0."""
    import torch
    from safetensors.torch import load_file
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.checkpointer import SingleGPUCheckpointer

    config = SpeculatorModelConfig.from_pretrained(str(trained))
    config.transformer_layer_config._attn_implementation = "simple_flex_attention"
    mapping = load_file(str(trained / "model.safetensors"))
    torch.manual_seed(0)
    model = Eagle3DraftModel(config=config, t2d=mapping["t2d"], d2t=mapping["d2t"])
    SingleGPUCheckpointer(where).save_checkpoint(model, torch.optim.AdamW(model.parameters()), 0)
    return newest(where)


def summary(result: dict) -> dict:
    """One engine's figures: start seconds, draft steps, accepted tokens, acceptance length
    and per position (``spec_decode.acceptance``), or its error."""
    if "error" in result:
        return {"error": result["error"], "tail": result["tail"][-8:]}
    run = result["runs"][0]
    spec = run["spec_decode"]
    return {
        "engine_start_s": result["engine_start_s"],
        "drafts": spec["drafts"],
        "draft_tokens": spec["draft_tokens"],
        "accepted": spec["accepted"],
        "acceptance_length": round(spec["acceptance_length"], 4) if spec["acceptance_length"] else None,
        "per_position": spec["per_position"],
        "output_tokens": run["output_tokens"],
    }


def judge(found: dict, device: str) -> bool:
    """Every draft served with draft steps, the ids those of the trained layers, and on a GPU
    the trained draft ahead of the untrained one."""
    drafts = found.get("drafts", {})
    served = all("error" not in d and d["drafts"] > 0 for d in drafts.values()) and bool(drafts)
    if not (served and found["aux_layer_ids"]["match"]):
        return False
    if device != "cuda":
        return True
    return drafts["trained"]["acceptance_length"] > drafts["untrained"]["acceptance_length"]

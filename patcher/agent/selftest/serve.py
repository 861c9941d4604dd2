"""selftest's serving stage: vLLM serves the EAGLE-3 draft the training stage just saved.

Runs under the target's interpreter after the training stage of one architecture, in the form
the README gives (``LLM(model=VERIFIER, speculative_config={"method": "eagle3", "model":
DRAFT, "num_speculative_tokens": 3})``), greedy, on ``PROMPTS`` seeded prompts of the tiny
verifier's vocabulary (``spec_decode``: one engine per process):

- the newest checkpoint the trainer saved, and on a GPU the same draft as built, before any
  optimizer step (saved by speculators' checkpointer), each in its own engine; the untrained
  draft's engine starts when training does (``Serving.untrained_saved``), the trained one's
  after it;
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
SERVE_TIMEOUT = 900  # seconds for the engines of an architecture to serve, from the end of training
NOT_ON_CPU = "on the CPU only with --serve (nothing is trained there: FlexAttention has no backward on the CPU)"


class Serving:
    """The serving stage in two steps, so that on a GPU the untrained draft's engine starts
    while training runs: ``untrained_saved`` (training's ``on_untrained``) launches it, ``finish``
    launches the trained draft's engine and collects both, ``close`` ends any engine still
    running (call it whatever happened). Each engine is one child process (``spec_decode``)."""

    def __init__(self, arch: str, model_dir: Path, device: str, asked: bool | None, progress) -> None:
        self.arch, self.model_dir, self.device, self.asked, self.progress = arch, model_dir, device, asked, progress
        self.workdir = model_dir.parent / f"{arch}-training"
        self.early: tuple | None = None  # (served ids, launched child) of the untrained draft
        self.early_error: BaseException | None = None
        self.children: list = []

    def not_wanted(self) -> str | None:
        """Why the stage does not run whatever training does (``--no-serve``; on the CPU unless
        asked), or None."""
        if self.asked is False:
            return "not asked (--no-serve)"
        if self.asked is None and self.device == "cpu":
            return NOT_ON_CPU
        return None

    def untrained_saved(self, draft: Path, layers: list[int]) -> None:
        """Launch the engine of the untrained draft saved at ``draft`` (the captured
        ``layers``: served + 1) before training starts; nothing unless serving will run."""
        if self.not_wanted():
            return
        try:
            served = aux_ids(draft, [i + 1 for i in layers])["served"]
            set_aux_ids(draft, served)
            self.early = (served, self._launch("untrained", draft))
        except Exception as exc:  # reported by finish, as the stage's error; training goes on
            self.early_error = exc

    def _launch(self, name: str, draft: Path) -> tuple:
        request = {
            "name": name,
            "verifier": str(self.model_dir),
            "draft": str(draft),
            "k": SPECULATIVE_TOKENS,
            "device": self.device,
            "kv_cache_bytes": KV_CACHE_BYTES,
            "runs": [{"name": "prompts", "prompts": prompts(self.model_dir), "max_tokens": MAX_TOKENS}],
        }
        child = spec_decode.launch(request, self.workdir / "serve-logs")
        self.children.append(child)
        return child

    def finish(self, report: dict) -> dict:
        """The serving stage of one architecture's ``report`` (after ``training``), once every
        engine has served or failed, or why it does not run (``skipped``: passes, unless asked for
        and impossible). ``asked``: ``--serve`` (True), ``--no-serve`` (False) or neither (None:
        on a GPU only)."""
        training = report.get("training") or {}
        if self.not_wanted():
            return {"skipped": self.not_wanted(), "ok": True}
        if "skipped" in training or not training.get("ok"):
            why = training.get("skipped") or "the training stage did not pass"
            return {"skipped": f"no draft to serve: {why}", "ok": "skipped" in training}
        found: dict = {"device": self.device, "speculative_tokens": SPECULATIVE_TOKENS, "seconds": {}}
        t0 = time.time()  # what serving adds after training (the untrained engine may have started before)
        try:
            self._serve(report, found)
        except Exception as exc:
            found["error"] = _error("serving", exc)
        found["seconds"]["total"] = round(time.time() - t0, 1)
        found["ok"] = "error" not in found and judge(found, self.device)
        self.progress(f"{self.arch}: serving: {'ok' if found['ok'] else 'FAILED'} in {found['seconds']['total']:.0f} s")
        return found

    def _serve(self, report: dict, found: dict) -> None:
        if self.early_error is not None:
            raise self.early_error
        trained = newest(self.workdir / "draft")
        found["aux_layer_ids"] = aux_ids(trained, [i + 1 for i in report["layers"]])
        served = found["aux_layer_ids"]["served"]
        set_aux_ids(trained, served)
        names = (["untrained"] if self.early else []) + ["trained"]
        self.progress(
            f"{self.arch}: serving: vLLM, EAGLE-3, {SPECULATIVE_TOKENS} speculative tokens, "
            f"{' and '.join(names)} draft{'s' if len(names) > 1 else ''}, aux layers {served}"
        )
        if self.early and self.early[0] != served:
            raise RuntimeError(f"the untrained draft was served layers {self.early[0]}, the trained one {served}")
        children = ([self.early[1]] if self.early else []) + [self._launch("trained", trained)]
        deadline = time.time() + SERVE_TIMEOUT
        results = []
        for child in children:
            results.append(spec_decode.collect(child, deadline))
            self.children.remove(child)
        found["drafts"] = {name: summary(result) for name, result in zip(names, results)}
        outputs = [r["runs"][0]["outputs"] for r in results if "error" not in r]
        if len(outputs) == 2:
            found["same_greedy_output"] = f"{sum(a == b for a, b in zip(*outputs))}/{PROMPTS}"
        failed = next((r for r in results if "error" in r), None)
        if failed is not None:
            found["error"] = engine_error(failed)

    def close(self) -> None:
        """End every engine launched and not collected (a failure, an interrupt)."""
        for _, proc, _ in self.children:
            spec_decode.kill(proc)
        self.children = []


def _error(stage: str, exc: BaseException) -> dict:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {"stage": stage, "type": type(exc).__name__, "message": str(exc).strip(), "traceback": "".join(tb)[-4000:]}


def prompts(model_dir: Path) -> list[list[int]]:
    """``PROMPTS`` seeded prompts of ``PROMPT_TOKENS`` ids from the verifier's vocabulary (the
    same for every engine, so their greedy outputs compare)."""
    vocab = verifier_vocab(model_dir)
    rng = random.Random(11)
    return [[rng.randrange(4, vocab) for _ in range(PROMPT_TOKENS)] for _ in range(PROMPTS)]


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

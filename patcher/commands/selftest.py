"""``selftest`` on the controller: ship the check to the target, read its report, judge it.

The check itself (``patcher/agent/selftest/``) runs under the target's interpreter through
the agent's ``run_python`` op, locally or over SSH: the same code either way. This module
only sends it and judges the report (``patcher.cli.reports`` relays its progress and
prints it): 0 every capture within the bound, 1 a capture out of bound or the generator
failed (its own error text, and the patch that addresses it when one does), 2 bad input or
a box that cannot run the check.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from patcher.agent.selftest import tiny_models
from patcher.agent.selftest.run import NOISE_LIMIT
from patcher.agent.selftest.training import LOSS_TOLERANCE as TRAINING_TOLERANCE
from patcher.commands.common import describe
from patcher.errors import UserError

if TYPE_CHECKING:
    from patcher.connect.transport import Transport
    from patcher.engine import Snapshot
    from patcher.fixes.registry import PatchSet


REMOTE = Path(__file__).resolve().parent.parent / "agent" / "selftest"
MARKER = "@@speculators-patch-selftest@@"
ARCHS = tuple(tiny_models.ARCHS)  # what the target side can build (the CLI's --arch choices)
# Per-token cosine similarity to transformers bf16, every (prompt, layer, token), must reach
# min(COSINE_FLOOR, 1 - 4 x (1 - c)) where c is transformers' own bf16-vs-fp32 cosine for that
# prompt and layer (patcher/agent/selftest/run.py bound_for). Correct captures of the default tiny models
# measure 0.9992-0.99999 on the CPU engine; every corruption seen measures below 0.4
# (another prompt's rows, a dropped llama_4_scaling). See docs/selftest.md.
COSINE_FLOOR = 0.999
ENV = {"VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}


def modules() -> dict[str, str]:
    """The remote package's sources, by file name (``launch.py`` is the script itself)."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(REMOTE.glob("*.py")) if p.name != "launch.py"}


def diagnose(error: dict, patches: PatchSet, speculators: str | None = None) -> str | None:
    """The patch whose fix addresses a failure ``error`` ({"type", "message", "traceback",
    "worker"}: the generator's or the training stage's) in the installed ``speculators``
    release (any release when it is unknown): the first patch, by id, with a ``symptoms``
    pattern found in the exception's own words, else in its tracebacks; of ``patches``, the
    target's (``Snapshot.patches``)."""
    worker = error.get("worker") or {}
    said = f"{error.get('type')}: {error.get('message')}\n{worker.get('type')}: {worker.get('message')}"
    tracebacks = f"{error.get('traceback', '')}\n{worker.get('raised', '')}"
    candidates = sorted(patches.written_for(speculators) if speculators else patches.patches, key=lambda p: p.id)
    for text in (said, tracebacks):
        for patch in candidates:
            if any(re.search(pattern, text) for pattern in patch.checks.symptoms):
                return patch.id
    return None


RUNNERS = ("auto", "v1", "v2", "both")  # --runner: vLLM's choice, V1, Model Runner V2, one run each


def request(
    archs: tuple[str, ...], model: str | None, device: str, tp: int, runner: str = "auto", serve: bool | None = None
) -> dict:
    """The remote ``run.main`` request; ``archs`` defaults to ``llama``; ``serve``: whether vLLM
    serves each trained draft (``--serve``/``--no-serve``; None: on a GPU only)."""
    unknown = [a for a in archs if a not in ARCHS]
    if unknown:
        raise UserError(f"unknown --arch {', '.join(unknown)} (known: {', '.join(ARCHS)})")
    if tp < 1:
        raise UserError(f"--tp must be at least 1, got {tp}")
    if runner not in RUNNERS:
        raise UserError(f"unknown --runner {runner} (known: {', '.join(RUNNERS)})")
    return {
        "archs": list(archs or ("llama",)),
        "model_path": model,
        "device": device,
        "tp": tp,
        "bound": COSINE_FLOOR,
        "runner": runner,
        "serve": serve,
    }


def run_remote(transport: Transport, snap: Snapshot, req: dict, timeout: float) -> dict:
    """One ``run_python`` exchange running the check; returns its report.
    Raises ``UserError`` when the target refused (no device, memory) or gave no report."""
    payload = {"modules": modules(), "request": req}
    answer = transport.request(
        "run_python",
        script=(REMOTE / "launch.py").read_text(encoding="utf-8"),
        input=json.dumps(payload),
        site_packages=snap.site_packages,
        timeout=timeout,
        env=ENV,
        stream_stderr=True,
        what="selftest",
    )
    for line in reversed(answer["stdout"].splitlines()):
        if line.startswith(MARKER):
            report = json.loads(line[len(MARKER) :])
            if "refused" in report:
                raise UserError(f"{transport.label}: selftest cannot run here: {report['refused']}")
            return report
    tail = [ln for ln in (answer["stdout"] + "\n" + transport.stderr_text()).splitlines() if ln.strip()]
    raise UserError(
        f"{transport.label}: selftest ended without a report (exit {answer['returncode']}): "
        f"{tail[-1] if tail else 'no output'}"
    )


@dataclass
class SelfTested:
    """What ``selftest`` found on one target: the judged report of the check (``report``,
    ``summarize``'s) and the data of ``selftest --json`` (``data``: the target described,
    ``ok``, the report as ``selftest``, the ``summary``)."""

    report: dict
    data: dict

    @property
    def ok(self) -> bool:
        """Whether every capture is within the bound and nothing failed."""
        return bool(self.report["ok"])

    @property
    def exit_code(self) -> int:
        """0 when ``ok``, else 1 (a capture out of bound, or the generator or training failed)."""
        return 0 if self.ok else 1

    @property
    def summary(self) -> str:
        """The line the report ends with (``verdict``)."""
        return verdict(self.report)

    @property
    def outcome(self) -> tuple[str, str]:
        """This host's (outcome, reason) in a run over several hosts: ``ok``, else
        ``disagrees`` with the architectures that failed and the captures out of bound."""
        if self.ok:
            return "ok", ""
        failed = [a["arch"] for a in self.report["archs"] if not a["ok"]]
        return (
            "disagrees",
            f"selftest failed: {', '.join(failed)} ({self.report['bad_captures']} captures out of bound)",
        )


def selftest(transport: Transport, snap: Snapshot, req: dict, timeout: float) -> SelfTested:
    """``selftest`` on one target: refuse a target without speculators, with a release no
    patch is written for (its generator is not ours to test) or without vLLM, run the check (``run_remote``,
    at most ``timeout`` seconds) and judge its report (``summarize``). Returns a
    ``SelfTested``. Raises ``UserError``."""
    from patcher import engine

    if snap.speculators_version is None:
        raise UserError(f"{transport.label}: speculators is not installed in this environment")
    engine.check_supported(snap)
    if snap.training_only:
        raise UserError(
            f"{transport.label}: selftest runs speculators' generator on vLLM first and trains on what it captures; "
            f"no vLLM is installed in {snap.site_packages}: run it in the data-generation env"
        )
    try:
        raw = run_remote(transport, snap, req, timeout)
    except UserError as failed:  # the import chain may be what broke: name it, as verify does
        raise UserError(explain(str(failed), transport, snap)) from None
    report = summarize(raw, snap.patches)
    return SelfTested(report, {**describe(snap), "ok": report["ok"], "selftest": report, "summary": verdict(report)})


def explain(failure: str, transport, snap) -> str:
    """``failure`` (selftest's one line when the check gave no report) with, when verify's
    import check finds a torchvision built for another torch on the target, that finding:
    transformers' own words ("Could not import module 'LlamaConfig'") do not name it. Costs
    one ``sources`` exchange, on this failure only; the failure as it was when that fails.
    ``transport``: a ``Transport`` or the run's ``Session``."""
    from patcher.checks.verify import verify_calls
    from patcher.connect.session import Session

    try:
        with Session.of(transport) as session:  # a bare transport (selftest's) or the run's session
            imports = verify_calls(session, snap).imports
    except (UserError, OSError):
        return failure
    found = [f for f in (imports.findings if imports else []) if f.kind == "torch-build-mismatch"]
    return failure + "".join(f"; verify's import check finds: {f.detail}" for f in found)


def summarize(report: dict, patches: PatchSet) -> dict:
    """Add verdicts: per architecture the patch of ``patches`` (the target's) that fixes a
    failure (of the generator or of the training stage), overall counts."""
    captures = bad = trained = attempted = served = served_attempts = 0
    speculators = report.get("versions", {}).get("speculators")
    for arch in report["archs"]:
        if "error" in arch:
            arch["error"]["patch"] = diagnose(arch["error"], patches, speculators)
        training = arch.get("training") or {}
        if "error" in training:
            training["error"]["patch"] = diagnose(training["error"], patches, speculators)
        serving = arch.get("serving") or {}
        if "error" in serving:
            serving["error"]["patch"] = diagnose(serving["error"], patches, speculators)
        attempted += bool(training) and "skipped" not in training
        trained += bool(training.get("ok")) and "skipped" not in training
        served_attempts += bool(serving) and "skipped" not in serving
        served += bool(serving.get("ok")) and "skipped" not in serving
        for case in arch["cases"]:
            captures += case.get("prompts", 0) * len(arch["layers"])
            bad += len(case.get("bad", []))
    report["captures"], report["bad_captures"] = captures, bad
    report["drafts_ok"], report["drafts"] = trained, attempted
    report["served_ok"], report["served"] = served, served_attempts
    return report


# What selftest's training stage does with a draft, by device (the CPU has no FlexAttention backward).
DRAFT_RUNS = {
    "cpu": "built and run (forward and loss; training needs a GPU)",
    "cuda": "trained by speculators' Trainer",
}


def verdict(report: dict) -> str:
    """The line a judged report (``summarize``) ends with: OK or FAILED, and the counts."""
    said = "OK" if report["ok"] else "FAILED"
    return (
        f"selftest: {said}: {len(report['archs'])} architecture(s), {report['captures']} captures, "
        f"{report['bad_captures']} out of bound (per-token cosine to transformers >= "
        f"min({report['bound']}, 1 - 4 x (1 - its own bf16 noise)), never below {NOISE_LIMIT}); "
        f"{report['drafts_ok']} of {report['drafts']} EAGLE-3 draft(s) {DRAFT_RUNS.get(report['device'], DRAFT_RUNS['cuda'])}, saved, "
        f"reloaded, loss matching a plain-torch reference (within {TRAINING_TOLERANCE:g}); " + served_words(report)
    )


def served_words(report: dict) -> str:
    """What the verdict says of the serving stage: how many trained drafts vLLM served as
    EAGLE-3, with their acceptance length (trained vs untrained); or that it did not run."""
    if not report.get("served"):
        return "no draft served by vLLM" + (" (on the CPU only with --serve)" if report["device"] == "cpu" else "")
    lengths = []
    for arch in report["archs"]:
        drafts = (arch.get("serving") or {}).get("drafts") or {}
        trained = drafts.get("trained", {}).get("acceptance_length")
        if trained is not None:
            untrained = drafts.get("untrained", {}).get("acceptance_length")
            lengths.append(f"{trained}" + (f" vs {untrained} untrained" if untrained is not None else ""))
    said = f"{report['served_ok']} of {report['served']} served by vLLM as EAGLE-3"
    return said + (f" (acceptance length {'; '.join(lengths)})" if lengths else "")

"""``verify``: every check of an install -- the library facts (vLLM, transformers, torch) and patch verdicts, the calls,
the imports, the model runner, user patches edited since applied, files modified after
patching, and the engine proof -- as data (``apply`` runs the same checks on what it wrote)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from patcher.commands.common import describe, mark_edited, source_changes

if TYPE_CHECKING:
    from patcher.checks.lifecycle import LifecycleCheck
    from patcher.checks.verify import CallsCheck
    from patcher.connect.transport import Transport
    from patcher.engine import Snapshot

# verify's exit code when every static check passes but the installed vLLM's release has no
# engine proof (patcher/checks/proven.py): a script can tell "not proven" (3) from "broken" (1).
UNPROVEN = 3


@dataclass
class InstallCheck:
    """What ``verify`` checks, for one target: the vLLM facts and the patch verdicts (rows,
    narrowed by ``--only``/``--skip``), the call, import and model-runner checks, the engine
    proof (``unproven``: why there is none; ``devices``: where the release was proven), user
    patches whose source changed, and files modified after patching. ``failing`` names each
    failed part in words; ``ok`` when none failed."""

    facts: list
    rows: list[dict]
    calls: CallsCheck
    unproven: str | None
    changed_sources: list[dict]
    modified: list[str]
    failing: list[str]
    devices: list[str] = field(default_factory=list)
    lifecycle: LifecycleCheck | None = None
    all_rows: list[dict] = field(default_factory=list)  # the verdict of every patch, counted or not

    @property
    def ok(self) -> bool:
        """True when no part failed (``verify``'s exit 0)."""
        return not self.failing

    @property
    def only_unproven(self) -> bool:
        """Every static check passes; only the engine proof is missing."""
        return self.failing == [NO_PROOF]

    @property
    def exit_code(self) -> int:
        """0 OK, ``UNPROVEN`` (3) when only the engine proof is missing, else 1."""
        return 0 if self.ok else UNPROVEN if self.only_unproven else 1

    @property
    def verdict(self) -> tuple[str, str]:
        """The one-line verdict ``verify`` ends with (``apply`` too, when it is not OK), as
        (the verdict, what follows it): ``verify: OK``, ``verify: NOT PROVEN`` with what
        is missing, or ``verify: FAILED`` with the parts that failed."""
        if self.ok:
            return "verify: OK", ""
        if self.only_unproven:  # what is missing and how to get it
            return "verify: NOT PROVEN", f" (every static check passes): {self.unproven}"
        return "verify: FAILED", f" ({', '.join(self.failing)})"

    @property
    def summary(self) -> str:
        """``verdict`` as one line of text."""
        return "".join(self.verdict)


NO_PROOF = "no engine proof for this vLLM"


@dataclass
class Verified:
    """What ``verify`` found on one target: every check (``check``) and its evidence as the
    data of ``verify --json`` (``data``)."""

    check: InstallCheck
    data: dict

    @property
    def exit_code(self) -> int:
        """The check's: 0 OK, ``UNPROVEN`` (3) when only the engine proof is missing, else 1."""
        return self.check.exit_code

    @property
    def summary(self) -> str:
        """The verdict ``verify`` ends with, in one line (``InstallCheck.summary``)."""
        return self.check.summary

    @property
    def outcome(self) -> tuple[str, str]:
        """This host's (outcome, reason) in a run over several hosts: ``ok``; ``unproven`` with
        why there is no engine proof (every static check passes); else ``disagrees`` with the
        patches whose verdict is not ok."""
        if self.check.ok:
            return "ok", ""
        if self.exit_code == UNPROVEN:
            return "unproven", self.check.unproven or "no engine proof"
        bad = sorted(r["id"] for r in self.check.rows if r.get("verdict") != "ok")
        return "disagrees", "verify failed: " + ", ".join(bad)


def check_install(
    transport: Transport,
    snap: Snapshot,
    ids: set[str],
    runtime: bool = False,
    advise: Callable[[str], str] = str,
    sent_ahead: tuple[dict, dict | None] | None = None,
) -> InstallCheck:
    """Every check ``verify`` makes on ``snap`` (one ``sources`` exchange, or none when it
    was sent ahead: ``sent_ahead`` is what ``verify.send_calls_ahead`` returned). ``ids``:
    the patches whose verdicts count; ``advise``: a fix hint as this caller words it (the
    CLI adds its target options)."""
    from patcher.checks import lifecycle, proven
    from patcher.checks.verify import verify, verify_calls

    facts, every = verify(snap)
    present = {c.patch.id for c in every if c.state in ("applied", "satisfied")}  # in the installed code
    facts, checks = [f for f in facts if f.patch.id in ids], [c for c in every if c.patch.id in ids]
    calls = verify_calls(transport, snap, runtime, sent_ahead)
    life = lifecycle.check(
        calls.vllm or {},
        snap.files.get(lifecycle.GENERATOR),
        snap.written,
        present,
    )
    unproven = proven.unproven(snap.vllm.version.split(", "), snap.speculators_version)
    proof_devices = proven.devices(snap.vllm.version.split(", "), snap.speculators_version)
    changed_sources = [c for c in source_changes(snap) if c["id"] in ids]
    rows = [
        {"id": c.patch.id, "needed": c.needed, "state": c.state, "verdict": c.verdict, "hint": advise(c.hint)}
        for c in checks
    ]
    mark_edited(changed_sources, rows, "verdict")
    modified = sorted(p for p in snap.recorded_paths() if snap.file_state(p) == "modified")
    failing = [
        what
        for what, bad in (
            ("the patch verdicts (fix column)", any(r["verdict"] not in ("ok", "source-changed") for r in rows)),
            ("the calls", not calls.ok),
            ("the engine's life cycle", life is not None and not life.ok),
            ("the imports", not calls.imports_ok),
            ("the model runner", not calls.runner_ok),
            ("a user patch's source", bool(changed_sources)),
            ("a file modified after patching", bool(modified)),
            (NO_PROOF, bool(unproven)),
        )
        if bad
    ]
    all_rows = [{"id": c.patch.id, "needed": c.needed, "state": c.state, "verdict": c.verdict} for c in every]
    return InstallCheck(facts, rows, calls, unproven, changed_sources, modified, failing, proof_devices, life, all_rows)


def _release(minor: tuple[int, int] | None) -> str | None:
    return None if minor is None else ".".join(map(str, minor))


def verify(
    transport: Transport, snap: Snapshot, chosen, runtime: bool = False, advise: Callable[[str], str] = str
) -> Verified:
    """``verify``: every check of ``check_install``, and its evidence as data (``verify
    --json``), as a ``Verified``; ``--only``/``--skip`` (``chosen``) narrow the patch checks,
    not the call check. Raises ``UserError`` on an unsupported target and as the ``sources``
    exchange does."""
    from patcher import engine
    from patcher.checks import proven

    engine.check_supported(snap)
    ids = {p.id for p in chosen}
    check = check_install(transport, snap, ids, runtime, advise)
    facts, rows, calls, unproven, changed_sources = (
        check.facts,
        check.rows,
        check.calls,
        check.unproven,
        check.changed_sources,
    )
    ok = check.ok
    data = {
        **describe(snap),
        "libraries": {name: snap.vllm.version_of(name) for name in sorted(snap.vllm.libraries)},
        "ok": ok,
        "facts": [
            {
                "patch": f.patch.id,
                "library": f.fact.library,
                "library_version": snap.vllm.version_of(f.fact.library),
                "symbol": f.fact.symbol,
                "summary": f.fact.summary,
                "holds": f.evidence.holds,
                "missing": f.evidence.missing,
                "file": f.evidence.file,
                "line": f.evidence.line,
                "found": f.evidence.found,
                "first_release": f.fact.first_release,
            }
            for f in facts
        ],
        "patches": rows,
        "calls": {
            "ok": calls.ok,
            "checked": len(calls.checked) + (len(calls.library.checked) if calls.library else 0),
            "findings": [f.as_dict() for f in calls.all_findings],
            "libraries": _libraries(calls, snap),
            "runtime": calls.runtime.as_dict() if calls.runtime else None,
        },
        "lifecycle": check.lifecycle.as_dict() if check.lifecycle else None,
        "imports": calls.imports.as_dict() if calls.imports else None,
        "model_runner": calls.runner.as_dict() if calls.runner else None,
        "user_patch_sources_changed": changed_sources,
        "modified_files": check.modified,
        "failing": check.failing,
        "summary": check.summary,
        "proven": {
            "oldest": _release(proven.oldest(snap.speculators_version)),
            "newest": _release(proven.newest(snap.speculators_version)),
            "unproven": unproven,
            "devices": check.devices,
            "releases": [
                {
                    "release": p.release,
                    "archs": list(p.archs),
                    "date": p.date,
                    "by": p.by,
                    "where": p.where,
                    "speculators": p.speculators,
                }
                for p in proven.PROVEN
            ],
        },
    }
    return Verified(check, data)


def _libraries(calls: CallsCheck, snap: Snapshot) -> dict:
    """Per library the calls check read (vLLM; transformers and torch, the training half's):
    its version (None: not installed, nothing checked), calls and imports checked, breaks, notes."""
    out = {}
    versions = {"vLLM": snap.vllm.version if snap.vllm else None}
    versions.update(calls.library.versions if calls.library else {})
    for lib, version in versions.items():
        findings = [f for f in calls.all_findings if f.library == lib]
        out[lib] = {
            "version": version,
            "checked": len(calls.checked) if lib == "vLLM" else calls.library.count(lib),
            "breaks": sum(f.severity == "error" for f in findings),
            "notes": sum(f.severity != "error" for f in findings),
        }
    return out

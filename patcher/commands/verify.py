"""``verify``: every check of an install -- the library facts (vLLM, transformers, torch) and patch verdicts, the calls,
the imports, the model runner, user patches edited since applied, files modified after
patching, and the engine proof -- as data (``apply`` runs the same checks on what it wrote)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from patcher.checks.check import NO_PROOF, TRAINING_HALF_ONLY, UNPROVEN, Found, InstallCheck
from patcher.commands.common import describe

if TYPE_CHECKING:
    from patcher.connect.session import Session
    from patcher.connect.transport import Transport
    from patcher.engine import Snapshot

__all__ = ["NO_PROOF", "TRAINING_HALF_ONLY", "UNPROVEN", "InstallCheck", "Verified", "check_install", "verify"]


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
    session: Session,
    snap: Snapshot,
    ids: set[str],
    runtime: bool = False,
    sent_ahead: tuple[dict, dict | None] | None = None,
) -> InstallCheck:
    """Every check ``verify`` makes on ``snap`` (``checks.checklist.checks``), after one
    ``sources`` exchange, or none when it was sent ahead: ``sent_ahead`` is what
    ``verify.send_calls_ahead`` returned. ``ids``: the patches whose verdicts count."""
    from patcher.checks.checklist import checks
    from patcher.checks.verify import verdicts, verify_calls

    facts, every = verdicts(snap)
    found = Found(snap, ids, facts, every, verify_calls(session, snap, runtime, sent_ahead))
    parts = {check.key: check.judge(found) for check in checks()}
    failing = [check.failing for check in checks() if not check.ok(parts[check.key])]
    verdict, proof = parts["verdicts"], parts["proven"]
    return InstallCheck(
        verdict.facts,
        verdict.rows,
        found.calls,
        proof.unproven,
        parts["user_patch_sources_changed"],
        parts["modified_files"],
        failing,
        proof.devices,
        parts,
        verdict.all_rows,
        snap.not_checked,
    )


def verify(transport: Transport | Session, snap: Snapshot, chosen, runtime: bool = False) -> Verified:
    """``verify``: every check of ``check_install``, and its evidence as data (``verify
    --json``), as a ``Verified``; ``--only``/``--skip`` (``chosen``) narrow the patch checks,
    not the call check. Raises ``UserError`` on an unsupported target and as the ``sources``
    exchange does."""
    from patcher import engine
    from patcher.checks.checklist import checks
    from patcher.connect.session import Session

    engine.check_supported(snap)
    with Session.of(transport) as session:
        check = check_install(session, snap, {p.id for p in chosen}, runtime)
    source = snap.libraries
    data = {
        **describe(snap),
        "libraries": {name: source.version_of(name) for name in sorted(source.libraries)},
        "not_checked": check.not_checked,
        "ok": check.ok,
    }
    for each in checks():
        data.update(each.as_json(check.parts[each.key], snap))
    data.update(failing=check.failing, summary=check.summary)
    data["proven"] = data.pop("proven")  # the engine proof after the verdict, as verify --json always had it
    return Verified(check, data)

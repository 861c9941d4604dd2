"""``apply``, as data: the commit, then verify's checks on what it wrote (``diff`` says what it
would write: ``commands.diff``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from patcher.commands.common import (
    describe,
    hand_edit_words,
    hand_edited,
    outcome_rows,
    refuse_before_planning,
    refuse_lost_state,
    unsupported_reason,
)
from patcher.commands.status import stale_reason
from patcher.commands.verify import UNPROVEN
from patcher.states import FileState

if TYPE_CHECKING:
    from patcher.commands.verify import InstallCheck
    from patcher.connect.session import Session
    from patcher.connect.transport import Transport
    from patcher.engine import CommitResult, Snapshot
    from patcher.fixes.patch import Patch


@dataclass
class Applied:
    """What ``apply`` did: the engine's ``result`` (its plans, the files written), a row per
    patch (``state`` ``applied-now`` for what this run wrote), the files that would change
    (a dry run), the files modified after patching, and (unless a dry run, or not asked for)
    verify's checks on the result."""

    result: CommitResult
    rows: list[dict]
    changed: list[str]
    modified: set[str]
    check: InstallCheck | None
    data: dict = field(default_factory=dict)
    left_out: list[dict] = field(default_factory=list)
    unsupported: str = ""  # status's reason when no patch handles this vLLM: nothing was written
    by_hand: list[str] = field(default_factory=list)  # a dry run: files changed by hand, never by this tool

    @property
    def exit_code(self) -> int:
        """2 when the target is unsupported (nothing written, as ``status`` exits); else
        verify's exit code on the result (0 when none was made); 1 at least when the commit's
        cleanup could not finish (``CommitResult.unfinished``)."""
        if self.unsupported:
            return 2
        code = 0 if self.check is None else self.check.exit_code
        return 1 if self.result.unfinished and code in (0, 3) else code

    @property
    def summary(self) -> str:
        """What was written (or would be), what was adopted, or why nothing was: the line
        under the patch table (two lines when files were adopted)."""
        result, dry_run = self.result, self.data.get("dry_run", False)
        if self.unsupported:
            return f"install is unsupported ({self.unsupported}): nothing was changed"
        lines = []
        if dry_run:
            lines.append(f"dry run: {len(self.changed)} file(s) would change, nothing written")
        elif result.written:
            lines.append(
                f"patched {len(result.written)} file(s) under {self.data['speculators_root']}: "
                f"{', '.join(result.written)}"
            )
        if result.adopted:
            lines.append(
                f"adopted {len(result.adopted)} file(s): each one's change is now part of its pristine copy "
                f"(stock speculators plus the change, what revert restores), with the patches on top: "
                f"{', '.join(result.adopted)}"
            )
        elif dry_run or result.written:
            pass
        elif self.modified:
            lines.append(f"nothing written: {', '.join(sorted(self.modified))} changed after patching (below)")
        elif self.stale:
            lines.append(f"nothing written: {stale_reason(self.stale, self.data['vllm'])}")
        elif self.left_out:
            lines.append(
                f"nothing written: every chosen patch is applied, but "
                f"{', '.join(r['id'] for r in self.left_out)} "
                f"{'is' if len(self.left_out) == 1 else 'are'} needed and left out by --only/--skip"
            )
        else:
            lines.append("nothing to do: every needed patch is already applied")
        return "\n".join(lines)

    @property
    def outcome(self) -> tuple[str, str]:
        """This host's (outcome, reason) in a run over several hosts: a dry run ``would-change``
        with the number of files it would change (else ``unchanged``); otherwise ``changed``
        with the files written and adopted, or ``unchanged``, unless verify's checks on the
        result fail: ``unproven`` when only the engine proof is missing (exit 3), else
        ``disagrees`` with the parts that failed."""
        if self.unsupported:
            return "unsupported", self.unsupported
        if self.data.get("dry_run"):
            return ("would-change", f"{len(self.changed)} file(s)") if self.changed else ("unchanged", "")
        written, adopted = self.result.written, self.result.adopted
        outcome, reason = ("changed", f"{len(written)} file(s) written") if written else ("unchanged", "")
        if adopted:
            outcome, reason = "changed", "; ".join(filter(None, [reason, f"{len(adopted)} file(s) adopted"]))
        if self.check is None or self.check.ok:
            return outcome, reason
        if self.exit_code == UNPROVEN:  # only the engine proof is missing
            return "unproven", "; ".join(filter(None, [reason, "verify: NOT PROVEN (every static check passes)"]))
        return "disagrees", "; ".join(filter(None, [reason, f"verify: FAILED ({', '.join(self.check.failing)})"]))

    @property
    def stale(self) -> list[str]:
        """The patches applied by us for another vLLM release, wrong for the installed one."""
        return sorted({r["id"] for r in self.rows if r["state"] == "stale"})

    @property
    def dry_run_modified(self) -> str | None:
        """In a dry run, the files apply would leave as they are and then fail verify's checks
        on, in one line: those changed after patching, and those changed by hand, never by this
        tool (``by_hand``); None when there are none."""
        if not (self.data.get("dry_run") and (self.modified or self.by_hand)):
            return None
        said, failing = [], []
        if self.modified:
            said.append(
                f"{', '.join(sorted(self.modified))} changed after patching: apply would not touch "
                f"{'it' if len(self.modified) == 1 else 'them'}"
            )
            failing.append("a file modified after patching")
        if self.by_hand:
            said.append(hand_edit_words(self.by_hand, "apply"))
            failing.append("a file changed by hand")
        return f"{'; '.join(said)}; apply would end with verify: FAILED ({', '.join(failing)})"


def apply(
    transport: Transport | Session,
    snap: Snapshot,
    chosen,
    dry_run: bool,
    adopt: bool = False,
    verify_after: bool = True,
    allow_partial: bool = False,
) -> Applied:
    """``apply``, then (unless ``dry_run``, or ``verify_after`` is False) every check
    ``verify`` makes on the result (its ``sources`` request rides on the commit, so it
    costs no round trip of its own): on the whole install, so a patch the installed vLLM
    needs that ``chosen`` leaves out fails the check and is named in ``left_out``, unless
    ``allow_partial`` (then the verdicts of ``chosen`` only count, as ``verify --only``).
    Returns an ``Applied``. Raises ``UserError`` (``Unsupported`` for an unsupported target)
    for a vLLM change no patch covers, a user patch whose file changed since it was applied,
    lost state, and what ``engine.apply`` refuses (a codemod's refusal, a file modified after
    patching, ``changed-since-read``)."""
    from patcher.connect.session import Session

    with Session.of(transport) as session:  # verify's request queued on the commit; the calls cache's lock
        return _apply(session, snap, chosen, dry_run, adopt, verify_after, allow_partial)


def _apply(
    session: Session,
    snap: Snapshot,
    chosen,
    dry_run: bool,
    adopt: bool,
    verify_after: bool,
    allow_partial: bool,
) -> Applied:
    from patcher import engine
    from patcher.checks.verify import recorded_states, send_calls_ahead
    from patcher.commands.verify import check_install

    refuse_before_planning(snap, chosen, "apply")
    plans = None  # planned once for this snapshot, then handed to the commit
    if any(snap.file_state(path) == FileState.EDITED for path in snap.files):
        plans = engine.plan(snap, chosen)
        if not engine.refusals(plans):  # a codemod's refusal comes first, from engine.apply, as in diff
            refuse_lost_state(snap, "apply", plans)
    planned = plans if plans is not None else engine.plan(snap, chosen)
    unsupported = unsupported_reason(outcome_rows(planned))  # status's verdict: write nothing
    check_after = verify_after and not dry_run and not unsupported
    sent_ahead = send_calls_ahead(session, snap) if check_after else None
    result = engine.apply(
        session,
        snap,
        chosen,
        dry_run=dry_run or bool(unsupported),
        adopt=adopt,
        plans=None if adopt else planned,  # adopting plans on new pristine copies
    )
    rows = outcome_rows(result.plans)
    moved = recorded_states(snap, result.plans)  # applied by us for another vLLM release: shown as status shows them
    for row in rows:
        row["state"] = moved.get(row["id"], row["state"])
    if result.written:  # in JSON as in text: what this run applied, not what was pending
        for row in rows:
            row["state"] = "applied-now" if row["state"] == "pending" else row["state"]
    changed = [] if unsupported else sorted({r["file"] for r in rows if r["state"] == "pending"})
    chosen_ids = {p.id for p in chosen}
    counted = chosen_ids if allow_partial else set(snap.patches.ids())
    check = check_install(session, engine.after(snap, result), counted, sent_ahead=sent_ahead) if check_after else None
    left_out = left_out_needed(check, chosen_ids, snap.patches.by_id()) if check else []
    modified = (
        set(check.modified)
        if check
        else {p.path for p in result.plans if snap.file_state(p.path) == FileState.MODIFIED}
    )
    for row in rows:
        if row["file"] in modified:
            row["file_modified"] = True
    by_hand = hand_edited(snap, result.plans) if dry_run and not unsupported else []  # else verify's check names them
    data = {
        **describe(snap),
        "dry_run": dry_run,
        "written": result.written,
        "adopted": result.adopted,
        "patches": rows,
        "modified_files": sorted(modified),
        "hand_edited_files": by_hand if dry_run else None,
        "verify": None if check is None else {"ok": check.ok, "failing": check.failing},
        "left_out": left_out,
        "allow_partial": allow_partial,
        "unfinished": result.unfinished,
        "unsupported": unsupported or None,
    }
    done = Applied(result, rows, changed, modified, check, data, left_out, unsupported, by_hand)
    data["summary"] = done.summary
    if unsupported:  # exit 2 says one error line, in --json an "error" (the table stays: it shows why)
        data["error"] = done.summary
    return done


def left_out_needed(check: InstallCheck, chosen_ids: set[str], by_id: dict[str, Patch]) -> list[dict]:
    """The patches the installed vLLM needs that are not in the install and that the choice
    (``--only``/``--skip``) left out: ``{"id", "risk"}`` (what goes wrong without it);
    ``by_id``: the target's patches by id (``PatchSet.by_id``)."""
    return [
        {"id": r["id"], "risk": by_id[r["id"]].risk or by_id[r["id"]].title}
        for r in sorted(check.all_rows, key=lambda r: r["id"])
        if r["id"] not in chosen_ids and r["verdict"] == "missing"
    ]

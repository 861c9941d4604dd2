"""``revert``, as data: the pristine files restored, or with ``partial`` only the chosen
patches dropped (``patcher.engine.revert``), and the summary both front ends print."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from patcher.commands.common import (
    describe,
    hand_edit_words,
    hand_edited,
    refuse_edited_user_patches,
    refuse_lost_state,
    refuse_other_versions,
)
from patcher.errors import UserError
from patcher.states import FileState

if TYPE_CHECKING:
    from patcher.connect.transport import Transport
    from patcher.engine import CommitResult, Snapshot


@dataclass
class Reverted:
    """What ``revert`` did (or, a dry run, would do): the engine's result, the files changed,
    the data of ``revert --json`` and the one-line ``summary``."""

    result: CommitResult
    changed: list[str]
    data: dict
    summary: str = ""

    @property
    def exit_code(self) -> int:
        """1 when the commit's cleanup could not finish (``CommitResult.unfinished``), else 0."""
        return 1 if self.result.unfinished else 0

    @property
    def outcome(self) -> tuple[str, str]:
        """This host's (outcome, reason) in a run over several hosts: a dry run ``would-change``
        with the number of files it would restore, else ``changed`` with the number written;
        ``unchanged`` when there are none."""
        if self.data["dry_run"]:
            return ("would-change", f"{len(self.changed)} file(s)") if self.changed else ("unchanged", "")
        written = self.data["written"]
        return ("changed", f"{len(written)} file(s) written") if written else ("unchanged", "")


def revert_summary(
    snap: Snapshot,
    result: CommitResult,
    changed: list[str],
    dry_run: bool,
    partial: bool = False,
    chosen_ids: frozenset[str] = frozenset(),
) -> str:
    """What ``revert`` restored (or would), or that nothing needed it, in one line (the
    ``Reverted.summary``); ``partial`` (``--only``/``--skip``): per file, the patches taken
    out and those it keeps, or, when nothing was, that the chosen patches (``chosen_ids``)
    are not applied. Raises nothing."""
    if dry_run:
        return f"dry run: {len(changed)} file(s) would be restored, nothing written"
    kept_on = {p: result.manifest.patches_of(p) for p in result.written} if result.manifest is not None else {}
    if partial and result.written:  # a file that keeps other patches is not "restored"
        return f"reverted under {snap.speculators_root}: " + "; ".join(
            _taken_out(path, snap.manifest.patches_of(path) if snap.manifest else {}, kept_on.get(path, {}))
            for path in result.written
        )
    if result.written:
        return f"restored {len(result.written)} file(s) under {snap.speculators_root}: {', '.join(result.written)}"
    back = snap.reinstalled_paths()
    if result.committed and back:
        kept = result.manifest is not None
        return f"nothing to restore: {snap.installer_did}; " + (
            f"dropped their record and pristine copies ({', '.join(back)})"
            if kept
            else f"removed {snap.state_dir}, its record and pristine copies"
        )
    if result.committed:
        return (
            f"nothing to revert: no file needed restoring; removed {snap.state_dir}, which recorded "
            f"nothing (left by an earlier run)"
        )
    if snap.raced:
        return "nothing to revert: another run restored the files first; no file needed restoring when read again"
    idle = sorted(set(chosen_ids) - set(snap.applied_ids()))
    if partial and idle:  # the patches asked for, named: none of them is in the install
        from patcher.engine.snapshot import id_ranges

        return f"nothing to revert: {id_ranges(idle)} {'is' if len(idle) == 1 else 'are'} not applied"
    return "nothing to revert: no file needed restoring"


def _taken_out(path: str, before: dict[str, int], after: dict[str, int]) -> str:
    """What a partial revert did to ``path``, whose record held ``before`` and now ``after``
    ({patch id: version}): the patches taken out, and those it keeps, or that it is pristine."""
    from patcher.engine.snapshot import id_ranges

    out = id_ranges(sorted(set(before) - set(after))) or "its patches"
    if not after:
        return f"took {out} out of {path}, which is pristine again"
    return f"took {out} out of {path}, which keeps its {len(after)} other patch(es) ({id_ranges(sorted(after))})"


def revert(
    transport: Transport,
    snap: Snapshot,
    chosen,
    partial: bool,
    force: bool,
    dry_run: bool,
) -> Reverted:
    """``revert``: restore the pristine files, or with ``partial`` drop only the chosen
    patches. A partial revert replays the patches it keeps from the pristine copies, so it
    refuses when one of those is a user patch whose file changed since it was applied.
    Returns a ``Reverted``. Raises ``UserError`` when the state was lost, for such a user
    patch, and as ``engine.revert`` refuses (a file modified after patching without ``force``,
    a record of another speculators release)."""
    from patcher import engine

    plans = _edited_plans(snap)
    refuse_lost_state(snap, "revert", plans)  # a hand edit of a file never patched is no lost state
    by_hand = hand_edited(snap, plans) if plans is not None else []
    if partial:  # the patches kept on the files it re-derives are applied again from the pristine copies
        ids = {p.id for p in chosen}
        entries = snap.recorded_paths()
        replayed = {pid for path in entries if set(snap.recorded(path)) & ids for pid in snap.recorded(path)}
        refuse_edited_user_patches(snap, replayed - ids, "this revert")
        refuse_other_versions(snap, replayed - ids, "this revert")
    result = engine.revert(
        transport,
        snap,
        chosen,
        partial=partial,
        force=force,
        dry_run=dry_run,
    )
    changed = [p.path for p in result.plans if p.changed]
    said = revert_summary(snap, result, changed, dry_run, partial, frozenset(p.id for p in chosen))
    if by_hand:
        said += f"; {hand_edit_words(by_hand, 'revert')}"
    return Reverted(
        result,
        changed,
        {
            **describe(snap),
            "dry_run": dry_run,
            "written": result.written,
            "would_change": changed,
            "unfinished": result.unfinished,
            "summary": said,
        },
        said,
    )


def _edited_plans(snap: Snapshot):
    """Every file planned with every patch written for ``snap``'s speculators, when a file
    differs from what pip installed with no record (``FileState.EDITED``): which of those hold
    this tool's fixes (the state was lost) and which were changed by hand only. None when no
    file is edited, when pip replaced the release (its files are pip's), or when a codemod
    refuses or the layout cannot be planned (then it cannot tell: ``refuse_lost_state`` says
    so for every edited file)."""
    from patcher import engine

    if snap.replaced_from or not any(snap.file_state(p) == FileState.EDITED for p in snap.files):
        return None
    try:
        plans = engine.plan(snap, snap.applicable)
    except UserError:
        return None
    return None if engine.refusals(plans) else plans

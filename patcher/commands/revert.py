"""``revert``, as data: the pristine files restored, or with ``partial`` only the chosen
patches dropped (``patcher.engine.revert``), and the summary both front ends print."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from patcher.commands.common import describe, refuse_edited_user_patches, refuse_lost_state

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


def revert_summary(snap: Snapshot, result: CommitResult, changed: list[str], dry_run: bool) -> str:
    """What ``revert`` restored (or would), or that nothing needed it, in one line (the
    ``Reverted.summary``). Raises nothing."""
    if dry_run:
        return f"dry run: {len(changed)} file(s) would be restored, nothing written"
    if result.written:
        return f"restored {len(result.written)} file(s) under {snap.speculators_root}: {', '.join(result.written)}"
    if result.committed:
        return (
            f"nothing to revert: no file needed restoring; removed {snap.state_dir}, which recorded "
            f"nothing (left by an earlier run)"
        )
    return "nothing to revert: no file needed restoring"


def revert(
    transport: Transport,
    snap: Snapshot,
    chosen,
    partial: bool,
    force: bool,
    dry_run: bool,
    advise: Callable[[str], str] = str,
) -> Reverted:
    """``revert``: restore the pristine files, or with ``partial`` drop only the chosen
    patches. A partial revert replays the patches it keeps from the pristine copies, so it
    refuses when one of those is a user patch whose file changed since it was applied.
    ``advise``: a way-out command as this caller words it (the CLI adds its target options).
    Returns a ``Reverted``. Raises ``UserError`` when the state was lost, for such a user
    patch, and as ``engine.revert`` refuses (a file modified after patching without ``force``,
    a record of another speculators release)."""
    from patcher import engine

    refuse_lost_state(snap, "revert", advise)
    if partial:  # the patches kept on the files it re-derives are applied again from the pristine copies
        ids = {p.id for p in chosen}
        entries = snap.recorded_paths()
        replayed = {pid for path in entries if set(snap.recorded(path)) & ids for pid in snap.recorded(path)}
        refuse_edited_user_patches(snap, replayed - ids, "this revert")
    result = engine.revert(
        transport,
        snap,
        chosen,
        partial=partial,
        force=force,
        dry_run=dry_run,
        repair_command=advise("speculators-patch repair"),
    )
    changed = [p.path for p in result.plans if p.changed]
    said = revert_summary(snap, result, changed, dry_run)
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

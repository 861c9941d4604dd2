"""Every file of a target planned: from the manifest's record (``fast_path``), from the
plan cache (``plan_cache``), or by running the codemods (``file_plan``)."""

from __future__ import annotations

from patcher.engine import fast_path, plan_cache
from patcher.engine.file_plan import FilePlan, Outcome, plan_file
from patcher.engine.snapshot import Snapshot, written_for
from patcher.errors import UserError
from patcher.fixes.patch import Patch


def plan(
    snap: Snapshot, chosen: tuple[Patch, ...], adopting: bool = False, bases: dict[str, bytes] | None = None
) -> list[FilePlan]:
    """Plan every file the chosen patches written for the installed speculators touch
    (``adopting``: see ``plan_file``; a file modified after patching is then planned from
    its new pristine copy in ``bases``, ``engine.adopt``). Raises ``UserError`` for a
    missing file."""
    plans = []
    fitting = written_for(snap.speculators_version, chosen)
    if chosen and not fitting:
        raise UserError(
            f"{', '.join(p.id for p in chosen)}: written for speculators "
            f"{' and '.join(sorted({p.speculators for p in chosen}))}, not {snap.speculators_version}; "
            f"nothing was changed"
        )
    chosen = fitting
    with plan_cache.turn(snap, chosen):
        for path in sorted({p.file for p in chosen}):
            source = snap.files.get(path)
            if source is None:
                users = [p.id for p in chosen if p.file == path and p.origin != "shipped"]
                if users:  # the user's patch names a file this speculators does not have
                    raise UserError(
                        f"{', '.join(users)} patches {path}, which speculators {snap.speculators_version} "
                        f"does not have (under {snap.speculators_root}); nothing was changed"
                    )
                raise UserError(
                    f"{path} not found under {snap.speculators_root}: "
                    f"not a speculators {snap.speculators_version} layout"
                )
            recorded = snap.recorded(path)
            if adopting and snap.file_state(path) == "modified":
                base = (bases or {}).get(path, source)
                fresh = plan_file(snap, path, base, chosen, {}, adopting=True)
                kept = fresh.after == source  # the patches are in the file already: shown as applied
                outcomes = [
                    Outcome(o.patch, "applied" if kept and o.state == "pending" else o.state, o.detail)
                    for o in fresh.outcomes
                ]
                plans.append(
                    FilePlan(
                        path,
                        source,
                        fresh.after,
                        outcomes,
                        adopted=base,
                        adopted_patches={o.patch.id: o.patch.version for o in fresh.outcomes if o.state == "pending"},
                    )
                )
                continue
            known = fast_path.outcomes(snap, path, source, chosen, recorded)
            plans.append(
                plan_cache.plan_file(snap, path, source, chosen, recorded)
                if known is None
                else FilePlan(path, source, source, known, reused=True)
            )
    return plans


def refusals(plans: list[FilePlan]) -> list[str]:
    return [o.detail for p in plans for o in p.outcomes if o.state == "refused"]


def guard_modified(snap: Snapshot, paths: list[str]) -> None:
    for path in paths:
        if snap.file_state(path) == "modified":
            raise UserError(
                f"{path} was modified after patching (sha256 matches neither the pristine nor the "
                f"patched file); `speculators-patch apply --adopt` keeps the change: it becomes part of the "
                f"pristine copy (stock speculators plus the change, which revert restores) and is patched"
            )

"""Every file of a target planned: from the manifest's record (``fast_path``), from the
plan cache (``plan_cache``), or by running the codemods (``file_plan``)."""

from __future__ import annotations

from patcher.engine import fast_path, plan_cache
from patcher.engine.file_plan import FilePlan, Outcome, plan_file
from patcher.engine.snapshot import Snapshot, sha256, written_for
from patcher.errors import UserError
from patcher.fixes.patch import Patch
from patcher.states import FileState
from patcher.ways import Way


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
            if adopting and snap.file_state(path) == FileState.MODIFIED:
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
            planned = (
                plan_cache.plan_file(snap, path, source, chosen, recorded)
                if known is None
                else FilePlan(path, source, source, known, reused=True)
            )
            plans.append(replayed(snap, planned, recorded) or planned)
    return plans


def replayed(snap: Snapshot, planned: FilePlan, recorded: dict[str, int]) -> FilePlan | None:
    """``planned`` with its bytes made from the pristine copy: the recorded patches and the
    pending ones (or refused on what the recorded ones wrote) run in order, as one ``apply``
    would have run them all. None when nothing is pending on a file we patched, or when a
    recorded patch is not at hand at its recorded version (a user patch without its source,
    another version), or the pristine copy does not match its recorded sha256: the file's
    own bytes are then patched as they are.

    A patch put back after ``revert --only`` would otherwise run on what later patches
    wrote: the prefix-caching patch (patches/sp004_disable_prefix_caching.py) refused the
    fixed-KV-cache patch's (sp026_fixed_kv_cache.py) ``CacheConfig(..., **_FIXED_KV_CACHE)``
    on vLLM 0.34 and left the install stuck as partial, and others wrote their code in another
    place than a full apply (bytes no engine ever proved). Raises nothing; a refusal is an outcome."""
    pending = [o.patch for o in planned.outcomes if o.state in ("pending", "refused") and o.patch.id not in recorded]
    original = snap.pristine.get(planned.path)
    entry = snap.entry(planned.path)
    pristine_sha256 = entry.pristine_sha256 if entry is not None else None
    if not (pending and recorded) or original is None or sha256(original) != pristine_sha256:
        return None
    at_hand = {p.id: p for p in snap.patches.patches if p.file == planned.path}
    kept = [at_hand.get(pid) for pid in recorded]
    if any(p is None or p.origin == "recorded" or p.version != recorded[p.id] for p in kept):
        return None
    in_order = tuple(sorted([*kept, *pending], key=lambda p: (p.order, p.id)))
    replay = plan_file(snap, planned.path, original, in_order, {}, only_needed=False)
    refused = {o.patch.id: o.detail for o in replay.outcomes if o.state == "refused"}
    if refused:  # shown as the replay found it: nothing is written
        first = next(iter(refused.values()))
        outcomes = [
            Outcome(o.patch, "refused", refused.get(o.patch.id, first)) if o.patch in pending else o
            for o in planned.outcomes
        ]
        return FilePlan(planned.path, planned.before, planned.before, outcomes)
    outcomes = [Outcome(o.patch, "pending") if o.patch in pending else o for o in planned.outcomes]
    return FilePlan(planned.path, planned.before, replay.after, outcomes)


def refusals(plans: list[FilePlan]) -> list[str]:
    return [o.detail for p in plans for o in p.outcomes if o.state == "refused"]


def guard_modified(snap: Snapshot, paths: list[str]) -> None:
    for path in paths:
        if snap.file_state(path) == FileState.MODIFIED:
            raise UserError(
                f"{path} was modified after patching (sha256 matches neither the pristine nor the "
                f"patched file); `{Way('apply', ('--adopt',))}` keeps the change: it becomes part of the "
                f"pristine copy (stock speculators plus the change, which revert restores) and is patched"
            )

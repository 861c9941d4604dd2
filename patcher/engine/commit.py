"""Writing a plan: ``apply`` and ``revert`` as one all-or-nothing ``commit`` exchange each.

The agent checks that every file and the manifest are still what the snapshot read, so
concurrent runs never lose an update (``changed-since-read``); the manifest records which
patches this tool applied to which file, with the pristine copy's digest.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import patcher
from patcher.connect.transport import Transport
from patcher.engine import fast_path
from patcher.engine.file_plan import FilePlan, plan_file
from patcher.engine.plan import guard_modified, plan, refusals
from patcher.engine.snapshot import Snapshot, sha256
from patcher.errors import UserError
from patcher.fixes.manifest import FileRecord, Manifest
from patcher.fixes.patch import Patch
from patcher.fixes.userpatches import record as user_records
from patcher.states import FileState
from patcher.ways import Way


@dataclass
class CommitResult:
    """``written``: the paths the commit wrote; ``manifest``: the manifest it wrote (None:
    none, or no commit: ``committed`` False)."""

    written: list[str]
    plans: list[FilePlan]
    recovered: bool = False
    manifest: Manifest | None = None
    committed: bool = False
    adopted: list[str] = field(default_factory=list)  # apply --adopt: files whose edit joined their pristine copy
    unfinished: str | None = None  # committed, but its cleanup stopped: one line with the command that recovers


def after(snap: Snapshot, result: CommitResult) -> Snapshot:
    """``snap`` as the target is once ``result``'s commit is done (the files it wrote, the
    manifest it wrote), for checking what was written without reading it again."""
    if not result.committed:
        return snap
    import dataclasses

    files = dict(snap.files)
    files.update({p.path: p.after for p in result.plans if p.path in result.written})
    return dataclasses.replace(snap, files=files, manifest=result.manifest, manifest_sha256=None)


def apply(
    transport: Transport,
    snap: Snapshot,
    chosen: tuple[Patch, ...],
    dry_run: bool = False,
    plans: list[FilePlan] | None = None,
    adopt: bool = False,
) -> CommitResult:
    """Apply the chosen patches all-or-nothing (one ``commit`` exchange, none if nothing changes).

    ``plans``: ``plan(snap, chosen)`` computed earlier (the Ansible collection's plan cache).
    ``adopt``: the change to a file modified after patching joins its pristine copy
    (``engine.adopt``: stock bytes plus the change, never patched bytes) and the file is
    patched on top of it, so ``revert`` gives back the change without the patches.
    Raises ``UserError`` on refusal, on a file modified after patching (unless ``adopt``),
    or when the agent cannot write; in every such case no file changed.
    """
    if plans is None:
        bases = {}
        if adopt:  # each file modified after patching: its new pristine copy, never patched bytes
            from patcher.engine.adopt import new_pristine

            bases = {
                path: new_pristine(snap, path)
                for path in sorted(snap.recorded_paths())
                if snap.file_state(path) == FileState.MODIFIED and path in {p.file for p in chosen}
            }
        plans = plan(snap, chosen, adopting=adopt, bases=bases)
    refused = refusals(plans)
    if refused:
        raise UserError(refused[0])
    changed = [p for p in plans if p.changed]
    if not adopt:
        guard_modified(snap, [p.path for p in changed])
    adopted = sorted(p.path for p in plans if p.adopted is not None)
    if dry_run or not (changed or adopted):
        return CommitResult([], plans)
    files = dict(snap.manifest.files) if snap.manifest is not None else {}
    pristine: dict[str, str] = {}
    for p in plans:
        if not (p.changed or p.adopted is not None):
            continue
        if p.adopted is not None:  # the user's edit on stock bytes, with the patches on top
            keep, original = dict(p.adopted_patches), p.adopted
        else:
            keep = snap.recorded(p.path)
            original = snap.pristine.get(p.path) if keep else p.before
            keep.update({o.patch.id: o.patch.version for o in p.outcomes if o.state == "pending"})
        if original is None:
            raise UserError(f"{snap.state_dir}: pristine copy of {p.path} is missing; reinstall speculators")
        pristine[p.path] = base64.b64encode(original).decode()
        # ``checked``: what later read-only runs answer from (patcher.fast_path), or None
        checked = fast_path.record(p.path, p.after, snap.applicable, snap.python_version)
        files[p.path] = FileRecord(sha256(original), sha256(p.after), keep, checked)
    fresh = {o.patch.id: o.patch for p in changed for o in p.outcomes if o.state == "pending"}
    result = _commit(transport, snap, changed, pristine, new_manifest(snap, files, fresh), plans, verb="apply")
    result.adopted = adopted
    return result


def _commit(
    transport: Transport,
    snap: Snapshot,
    changed: list[FilePlan],
    pristine: dict[str, str],
    manifest: Manifest | None,
    plans: list[FilePlan],
    **extra: object,
) -> CommitResult:
    """One ``commit`` exchange: the agent checks that each file and the manifest are still
    what ``snap`` read (else ``changed-since-read``), so concurrent runs never lose an update."""
    answer = transport.request(
        "commit",
        state_dir=snap.state_dir,
        root=snap.speculators_root,
        writes={
            p.path: {
                "expect_sha256": sha256(p.before),
                "sha256": sha256(p.after),
                "data": base64.b64encode(p.after).decode(),
            }
            for p in changed
        },
        pristine=pristine,
        manifest=None if manifest is None else manifest.as_dict(),
        manifest_expect_sha256=snap.manifest_sha256,
        **extra,
    )
    return CommitResult(
        answer["written"], plans, answer["recovered"], manifest, committed=True, unfinished=answer.get("unfinished")
    )


def new_manifest(
    snap: Snapshot, files: dict[str, FileRecord], fresh: dict[str, Patch] | None = None
) -> Manifest | None:
    """The manifest to write for ``files`` (None when there is none: nothing recorded); user
    patches get a record (``user_records.KEY``): from their loaded source when applied now
    (``fresh``), else as recorded before. Written by this version, for ``snap``'s releases."""
    if not files:
        return None
    return Manifest(
        tool=f"speculators-patch {patcher.__version__}",
        speculators_version=snap.speculators_version,
        vllm_versions=snap.vllm_version,
        files=dict(files),
        user_patches=user_records.merged(snap.manifest, files, fresh or {}),
    )


def revert(
    transport: Transport,
    snap: Snapshot,
    chosen: tuple[Patch, ...],
    partial: bool,
    force: bool = False,
    dry_run: bool = False,
) -> CommitResult:
    """Restore pristine bytes, or with ``partial`` re-derive each file from its pristine copy
    with the recorded patches minus the chosen ones. Raises ``UserError`` on a file modified
    after patching unless ``force``, and on a record of another speculators release (naming
    ``repair``, which drops it)."""
    entries = dict(snap.manifest.files) if snap.manifest is not None else {}
    if snap.replaced_from:
        raise UserError(
            f"{snap.installer_did}; not restoring them over another release; nothing was changed; "
            f"`{Way('repair')}` drops that record and its copies"
        )
    plans, files, fresh = [], {}, {}
    chosen_ids = {p.id for p in chosen}
    for path in sorted(entries):
        state, current = snap.file_state(path), snap.files.get(path)
        if state in (FileState.PRISTINE, FileState.REINSTALLED) or current is None:
            continue
        if partial and not set(entries[path].patches) & chosen_ids:
            files[path] = entries[path]  # none of the chosen patches is on it: left as it is, edited or not
            continue
        if state == FileState.MODIFIED and not force:
            raise UserError(
                f"{path} was modified after patching (sha256 matches neither the pristine nor the patched "
                f"file); `{Way('revert', ('--force',))}` restores the copy kept before patching and discards that "
                f"edit; `{Way('apply', ('--adopt',))}` keeps the edit instead (it joins the pristine copy revert "
                f"restores)"
            )
        original = snap.pristine.get(path)
        if original is None or sha256(original) != entries[path].pristine_sha256:
            raise UserError(
                f"{snap.state_dir}: the pristine copy of {path} is missing or does not match its "
                f"recorded sha256; nothing was restored; run `{Way('repair')}`"
            )
        keep = dict(entries[path].patches) if partial else {}
        for patch in chosen:
            keep.pop(patch.id, None)
        kept = tuple(p for p in snap.patches.patches if p.id in keep)
        replay = plan_file(snap, path, original, kept, {}, only_needed=False)
        if refusals([replay]):
            raise UserError(refusals([replay])[0])
        # Record what the replay really applied, not what was asked for.
        keep = {o.patch.id: o.patch.version for o in replay.outcomes if o.state == "pending"}
        fresh.update({o.patch.id: o.patch for o in replay.outcomes if o.state == "pending"})
        target = replay.after
        plans.append(FilePlan(path, current, target))
        if keep:
            files[path] = FileRecord(sha256(original), sha256(target), keep)
    changed = [p for p in plans if p.changed]
    manifest = new_manifest(snap, files, fresh)
    same_record = {k: v.patches for k, v in files.items()} == {
        k: v.patches for k, v in entries.items() if snap.file_state(k) in (FileState.PATCHED, FileState.MODIFIED)
    }
    litter = not partial and snap.manifest is None and snap.state_exists and not snap.backups
    # a recorded file the installer put back (``pip install --force-reinstall``): its record goes
    reinstalled = [p for p in entries if p not in files and snap.file_state(p) == FileState.REINSTALLED]
    if dry_run or (not changed and same_record and not litter and not reinstalled):
        return CommitResult([], plans)
    # (``litter``: a state directory recording nothing, left by an earlier run: the commit removes it)
    return _commit(transport, snap, changed, {}, manifest, plans, verb="revert")

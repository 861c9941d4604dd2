"""``repair``: a consistent state rebuilt from what is on disk (docs: ``repair``)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from patcher.connect.transport import Transport
from patcher.engine.commit import new_manifest
from patcher.engine.file_plan import plan_file
from patcher.engine.snapshot import Snapshot, read_snapshot, sha256, unknown_patches
from patcher.errors import UserError
from patcher.fixes.manifest import FileRecord, Manifest
from patcher.fixes.registry import PatchSet
from patcher.fixes.userpatches import record as user_records
from patcher.ways import Way


@dataclass
class RepairResult:
    """What ``repair`` did: ``lines``, one per file; ``unrestorable``: files of the install
    that differ from pip's RECORD with neither a record nor a kept copy (edited outside
    this tool, or a copy lost to an earlier version of it): no command here can restore
    them, reinstalling speculators does."""

    snap: Snapshot
    lines: list[str]
    unrestorable: list[str]
    dropped: str | None = None  # the speculators release whose record was dropped (another one is installed)
    after: Snapshot | None = None  # the install as read after the agent's repair, before the new record
    rewritten: list[str] = field(default_factory=list)  # what the new manifest changed (``record_changes``)


def repair(transport: Transport, patches: PatchSet | None = None) -> RepairResult:
    """Rebuild a consistent state from what is on disk, changing no speculators file except
    to finish rolling back an interrupted commit where the files allow it.

    Per file: the installed bytes equal to a verified pristine copy (or to pip's RECORD) ->
    no record; equal to what the manifest records as patched, with that record's verified
    copy -> that record, kept (a user patch whose source is not at hand included); equal
    to a verified copy with a set of patches replayed -> that record; otherwise, with a
    verified copy, a record under which ``status`` says ``modified``. Copies nothing
    references are deleted. Every other speculators file is compared with pip's RECORD.
    ``patches``: this run's (``read_snapshot``'s; None: shipped and installed packs).
    Returns the snapshots read before and after, one line per file, and the unrestorable files.
    Raises ``UserError`` when a patched file has no verified pristine copy left (way out:
    reinstall speculators, then ``repair`` again), or when the state cannot be written.
    """
    first = read_snapshot(transport, patches, tolerate_damage=True)
    transport.request("repair", state_dir=first.state_dir, root=first.speculators_root)
    snap = read_snapshot(transport, first.patches, tolerate_damage=True, record_check=True)
    # (``read_snapshot`` parsed the manifest tolerantly: ``damaged``, entries that are no record)
    entries = dict(snap.manifest.files) if snap.manifest is not None else {}
    damaged = snap.manifest.damaged if snap.manifest is not None else frozenset()
    files, lines = {}, []
    paths = sorted({p.file for p in snap.patches.patches} | set(entries) | damaged | set(snap.backups))
    kept_for = snap.manifest.speculators_version if snap.manifest is not None else None
    if snap.replaced_from:  # a reinstall of another version replaced the files (not an edited version field)
        lines.append(
            f"{snap.installer_name} replaced speculators {kept_for} by {snap.speculators_version} since it was "
            f"patched: the record of {kept_for} and its pristine copies are dropped"
        )
        paths = []
    for path in paths:
        record, line = _repair_file(snap, path, entries, path in damaged)
        if record is not None:
            files[path] = record
        if line is not None:
            lines.append(line)
    written, committed = _commit_records(transport, snap, files)
    unrestorable = [p for p in (snap.record_differs or []) if p not in files]
    for path in unrestorable:
        lines.append(
            f"{path}: differs from what pip installed (its RECORD) and no record or pristine copy "
            f"covers it: nothing here can restore it (edited outside speculators-patch, or its copy was "
            f"lost); pip install --force-reinstall --no-deps speculators=={snap.speculators_version} does"
        )
    dropped = snap.replaced_from
    changes = record_changes(snap.manifest, written)
    if committed and written is not None:
        changes += _dropped_copies(snap, files)
    if committed and snap.mismatched_copies:
        n = len(snap.mismatched_copies)
        changes.append(
            f"removed {n} file(s) under pristine/ whose bytes do not match the digest in {'its' if n == 1 else 'their'}"
            f" name, so nothing could restore from {'it' if n == 1 else 'them'} ({', '.join(snap.mismatched_copies)})"
        )
    return RepairResult(first, lines, unrestorable, dropped, snap, changes)


def _dropped_copies(snap: Snapshot, files: dict[str, FileRecord]) -> list[str]:
    """The kept copies a repair commit removed (the new record, ``files``, names none of them:
    a stray copy, or an older one of a file whose record was rebuilt), as one phrase; [] when
    none was. A copy of a file that is not installed stays (the commit keeps what may be all
    that is left of it), so it is not named."""
    paths = sorted(
        p
        for p, copies in snap.backups.items()
        for c in copies
        if (p not in files or sha256(c) != files[p].pristine_sha256) and (p in files or snap.files.get(p) is not None)
    )
    if not paths:
        return []
    return [f"removed {len(paths)} kept cop{'y' if len(paths) == 1 else 'ies'} no record names ({', '.join(paths)})"]


def record_changes(old: Manifest | None, new: Manifest | None) -> list[str]:
    """What writing ``new`` over ``old`` (each None for no manifest) changed, one phrase each:
    the manifest removed or written, the files whose record was dropped, added or rewritten,
    the user patch records and the top-level fields. [] when the record is the same."""
    if old is None and new is None:
        return []
    if new is None:
        return [f"removed manifest.json and the pristine copies (it recorded {len(old.files)} file(s))"]
    if old is None:
        return [f"wrote manifest.json ({len(new.files)} file(s) recorded)"]
    was, now = old.as_dict(), new.as_dict()
    said = []
    for what, paths in (
        ("dropped the record of", sorted(set(was["files"]) - set(now["files"]))),
        ("recorded", sorted(set(now["files"]) - set(was["files"]))),
        (
            "rewrote the record of",
            sorted(p for p in now["files"] if was["files"].get(p, now["files"][p]) != now["files"][p]),
        ),
    ):
        if paths:
            said.append(f"{what} {', '.join(paths)}")
    fields = sorted(k for k in set(was) | set(now) if k != "files" and was.get(k) != now.get(k))
    if fields:
        said.append(f"rewrote {', '.join(fields)}")
    return said


def _repair_file(
    snap: Snapshot, path: str, entries: dict[str, FileRecord], damaged: bool = False
) -> tuple[FileRecord | None, str | None]:
    """What ``repair`` makes of one file: (its record in the new manifest, None for none; the
    line that says so, None for a file that is not installed). ``entries``: the old manifest's
    records; ``damaged``: the old manifest names the file with an entry that is no record.
    Raises ``UserError`` when the old manifest names the file but it is not the pristine
    file and no verified pristine copy of it is left."""
    current = snap.files.get(path)
    if current is None:
        return None, None
    copies = list(snap.backups.get(path, []))
    record = snap.record.get(path)
    if record is not None:  # pip's RECORD vouches for the copy (the manifest may be gone)
        copies = [c for c in copies if sha256(c) == record] or copies
    digest = sha256(current)
    if digest == record or any(digest == sha256(c) for c in copies):
        return None, f"{path}: pristine"
    entry = entries.get(path)
    if (
        entry is not None
        and entry.patched_sha256 == digest
        and entry.patches  # (a patches map that is not {id: version} was read as none)
        and not unknown_patches(entry)  # (an id no release has: the record was edited)
        and any(sha256(c) == entry.pristine_sha256 for c in snap.backups.get(path, []))
    ):
        # the record it has still describes the file and its copy
        return entry, f"{path}: patched ({', '.join(sorted(entry.patches))}), as recorded"
    found = _replayed(snap, path, copies, current)
    if found:
        copy, replayed = found
        return FileRecord(sha256(copy), digest, replayed), f"{path}: patched ({', '.join(sorted(replayed))})"
    if copies:
        return (
            _modified_record(entry, copies, digest),
            f"{path}: modified after patching (`{Way('revert', ('--force',))}` restores the kept pristine copy)",
        )
    if path in entries or damaged:
        raise UserError(
            f"cannot repair {path}: it is not the pristine file and no verified pristine copy is left; "
            f"reinstall speculators (pip install --force-reinstall --no-deps "
            f"speculators=={snap.speculators_version}), then run `{Way('repair')}` again"
        )
    return None, None


def _replayed(snap: Snapshot, path: str, copies: list[bytes], current: bytes) -> tuple[bytes, dict] | None:
    """(the copy, {patch id: version}) when replaying patches on one of ``copies`` gives
    ``current``: first the patches this vLLM needs, then every patch; else None."""
    for copy in copies:
        for only_needed in (True, False):
            try:
                replay = (
                    plan_file(snap, path, copy, snap.patches.patches, {}, only_needed=only_needed)
                    if not snap.training_only or not only_needed
                    else None
                )
            except UserError:
                replay = None
            if replay is not None and replay.after == current:
                return copy, {o.patch.id: o.patch.version for o in replay.outcomes if o.state == "pending"}
    return None


def _modified_record(entry: FileRecord | None, copies: list[bytes], digest: str) -> FileRecord:
    """The record of a file edited after patching (``digest``: its bytes now), under which
    ``status`` says ``modified``: the old record's copy (else the first verified one), its
    patches when well formed (``entry``: the old record, None for none), and a patched
    digest that is not the file's."""
    pristine = entry.pristine_sha256 if entry is not None else None
    kept = next((c for c in copies if sha256(c) == pristine), copies[0])
    patched = (entry.patched_sha256 if entry is not None else None) or sha256(kept)
    if patched == digest:
        patched = sha256(kept)
    return FileRecord(sha256(kept), patched, dict(entry.patches) if entry is not None else {})


def _commit_records(transport: Transport, snap: Snapshot, files: dict[str, FileRecord]) -> tuple[Manifest | None, bool]:
    """Write the rebuilt manifest (``files``: its records) and the pristine copies it names,
    as a ``repair`` commit: no speculators file is written, copies nothing names go. Returns
    the manifest now on the target (None: none) and whether a commit was made."""
    pristine = {
        p: base64.b64encode(next(c for c in snap.backups[p] if sha256(c) == e.pristine_sha256)).decode()
        for p, e in files.items()
    }
    recorded_before = user_records.records(snap.manifest)
    loaded = {p.id: p for p in snap.patches.user_patches() if p.id not in recorded_before}
    manifest = new_manifest(snap, files, loaded)
    same = (  # the record as it was and every kept copy named by it: nothing to write, the bytes stay
        manifest is not None
        and snap.manifest is not None
        and not snap.state_problem
        and manifest.as_dict() == snap.manifest.as_dict()
        and set(snap.backups) == set(files)
        and all(len(copies) == 1 for copies in snap.backups.values())
        and not snap.mismatched_copies  # a file whose bytes are not its name's digest: the commit removes it
    )
    committed = not same and (snap.state_exists or manifest is not None)  # no state, none to write: read-only
    if committed:
        transport.request(
            "commit",
            state_dir=snap.state_dir,
            root=snap.speculators_root,
            writes={},
            pristine=pristine,
            manifest=None if manifest is None else manifest.as_dict(),
            manifest_expect_sha256=snap.manifest_sha256,
            repair=True,
            verb="repair",
        )
    return manifest, committed

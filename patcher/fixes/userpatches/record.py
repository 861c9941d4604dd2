"""What a target's manifest keeps about the user patches applied to it.

``manifest["user_patches"]`` maps each applied user patch's id to::

    {"name", "version", "title", "file", "origin": "file" | "package",
     "source": "/abs/fix001.py" | "<distribution> <version>", "sha256": "<hex of the source file>"}

(the per-file ``patches`` maps keep ``id -> version`` for user and shipped patches alike);
on the controller each is a ``patcher.fixes.manifest.UserPatchRecord``.
With it, ``status`` names a user patch and its origin, and ``revert --only FIX001`` works,
without the file at hand; ``verify`` compares the recorded sha256 with the loaded source.
"""

from __future__ import annotations

from typing import Iterable

from patcher.fixes.manifest import USER_PATCHES, FileRecord, Manifest, UserPatchRecord
from patcher.fixes.patch import Patch

KEY = USER_PATCHES


def entry(patch: Patch) -> UserPatchRecord:
    """The manifest record of a user patch applied now."""
    return UserPatchRecord(
        name=patch.name,
        version=patch.version,
        title=patch.title,
        file=patch.file,
        origin=patch.origin,
        source=patch.source,
        sha256=patch.source_sha256,
    )


def records(manifest: Manifest | None) -> dict[str, UserPatchRecord]:
    """The user patch records of a manifest (``{}`` for none)."""
    return {} if manifest is None else dict(manifest.user_patches)


def merged(
    old_manifest: Manifest | None, files: dict[str, FileRecord], fresh: dict[str, Patch]
) -> dict[str, UserPatchRecord]:
    """Records for the user patches ``files`` (the new manifest's per-file records) names:
    those applied by this commit (``fresh``) from their loaded source, the others as the
    old manifest recorded them."""
    named = {pid for e in files.values() for pid in e.patches}
    old = records(old_manifest)
    out = {}
    for pid in sorted(named):
        if pid in fresh and fresh[pid].origin in ("file", "package"):
            out[pid] = entry(fresh[pid])
        elif pid in old:
            out[pid] = old[pid]
    return out


def stand_in(pid: str, record: UserPatchRecord | None, file: str, version: int) -> Patch:
    """A recorded user patch whose source is not loaded: it can be named (``--only``), shown
    (``status``) and dropped (``revert --only``); where it is recorded the engine reports it
    ``applied`` without running it, and running it (a replay, a reinstalled file) refuses,
    naming the way out."""
    record = record or UserPatchRecord()
    source = record.source or "an unknown source"
    hint = (
        f"--patch-file {source}"
        if record.origin == "file"
        else f"install {source}"
        if record.origin == "package"
        else "--patch-file <its file>"
    )

    from patcher.fixes.patch import PatchCodemod, PatchRefused  # libcst: only when a stand-in is built

    class Unavailable(PatchCodemod):
        def transform_module_impl(self, tree):
            raise PatchRefused(f"{pid} was applied from {source}, which this run has not loaded: pass {hint}")

    return Patch(
        id=pid,
        name=record.name or pid.lower(),
        version=record.version or version,
        title=record.title or f"user patch {pid}",
        file=record.file or file,
        codemod=Unavailable,
        speculators=">=0",
        origin="recorded",
        source=f"{'unknown origin' if record.origin is None else record.origin} {source}",
        source_sha256=record.sha256 or "",
    )


def source_changes(manifest: Manifest | None, loaded: Iterable[Patch], applied: set[str]) -> list[dict]:
    """Loaded user patches applied to the target (``applied``: recorded ids in patched files)
    whose source file's sha256 differs from the one recorded when they were applied."""
    old = records(manifest)
    out = []
    for patch in loaded:
        rec = old.get(patch.id)
        if patch.id in applied and rec and rec.sha256 and rec.sha256 != patch.source_sha256:
            out.append(
                {
                    "id": patch.id,
                    "source": patch.source,
                    "recorded_sha256": rec.sha256,
                    "sha256": patch.source_sha256,
                    "recorded_source": rec.source,
                }
            )
    return out

"""What a target's manifest keeps about the user patches applied to it.

``manifest["user_patches"]`` maps each applied user patch's id to::

    {"name", "version", "title", "file", "origin": "file" | "package",
     "source": "/abs/fix001.py" | "<distribution> <version>", "sha256": "<hex of the source file>"}

(the per-file ``patches`` maps keep ``id -> version`` for user and shipped patches alike).
With it, ``status`` names a user patch and its origin, and ``revert --only FIX001`` works,
without the file at hand; ``verify`` compares the recorded sha256 with the loaded source.
"""

from __future__ import annotations

from typing import Iterable

from patcher.fixes.patch import Patch

KEY = "user_patches"


def entry(patch: Patch) -> dict:
    """The manifest record of a user patch applied now."""
    return {
        "name": patch.name,
        "version": patch.version,
        "title": patch.title,
        "file": patch.file,
        "origin": patch.origin,
        "source": patch.source,
        "sha256": patch.source_sha256,
    }


def records(manifest: dict | None) -> dict[str, dict]:
    """The user patch records of a manifest (``{}`` for none or a malformed one)."""
    found = (manifest or {}).get(KEY) if isinstance(manifest, dict) else None
    return {k: v for k, v in found.items() if isinstance(v, dict)} if isinstance(found, dict) else {}


def merged(old_manifest: dict | None, files: dict, fresh: dict[str, Patch]) -> dict[str, dict]:
    """Records for the user patches ``files`` (the new manifest's per-file map) names:
    those applied by this commit (``fresh``) from their loaded source, the others as the
    old manifest recorded them."""
    named = {pid for e in files.values() for pid in e["patches"]}
    old = records(old_manifest)
    out = {}
    for pid in sorted(named):
        if pid in fresh and fresh[pid].origin in ("file", "package"):
            out[pid] = entry(fresh[pid])
        elif pid in old:
            out[pid] = old[pid]
    return out


def stand_in(pid: str, record: dict | None, file: str, version: int) -> Patch:
    """A recorded user patch whose source is not loaded: it can be named (``--only``), shown
    (``status``) and dropped (``revert --only``); where it is recorded the engine reports it
    ``applied`` without running it, and running it (a replay, a reinstalled file) refuses,
    naming the way out."""
    record = record or {}
    source = record.get("source") or "an unknown source"
    hint = (
        f"--patch-file {source}"
        if record.get("origin") == "file"
        else f"install {source}"
        if record.get("origin") == "package"
        else "--patch-file <its file>"
    )

    from patcher.fixes.patch import PatchCodemod, PatchRefused  # libcst: only when a stand-in is built

    class Unavailable(PatchCodemod):
        def transform_module_impl(self, tree):
            raise PatchRefused(f"{pid} was applied from {source}, which this run has not loaded: pass {hint}")

    return Patch(
        id=pid,
        name=str(record.get("name") or pid.lower()),
        version=int(record.get("version") or version),
        title=str(record.get("title") or f"user patch {pid}"),
        file=str(record.get("file") or file),
        codemod=Unavailable,
        speculators=">=0",
        origin="recorded",
        source=f"{record.get('origin', 'unknown origin')} {source}",
        source_sha256=str(record.get("sha256") or ""),
    )


def source_changes(manifest: dict | None, loaded: Iterable[Patch], applied: set[str]) -> list[dict]:
    """Loaded user patches applied to the target (``applied``: recorded ids in patched files)
    whose source file's sha256 differs from the one recorded when they were applied."""
    old = records(manifest)
    out = []
    for patch in loaded:
        rec = old.get(patch.id)
        if patch.id in applied and rec and rec.get("sha256") and rec["sha256"] != patch.source_sha256:
            out.append(
                {
                    "id": patch.id,
                    "source": patch.source,
                    "recorded_sha256": rec["sha256"],
                    "sha256": patch.source_sha256,
                    "recorded_source": rec.get("source"),
                }
            )
    return out

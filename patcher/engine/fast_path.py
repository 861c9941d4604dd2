"""Answers the read-only paths can give without running a codemod (docs/speed.md).

``apply`` records in the manifest, for each file it writes, what every codemod written for
that file says about the bytes it wrote (``checked``: the tool that ran them, the target's
grammar version, and per patch id its version and the "already satisfied" detail). A later
``status``, ``verify``, ``diff`` or ``apply`` on a file whose sha256 is still that patched
digest, with the same tool and grammar, then knows each needed patch's outcome without
parsing: every recorded patch leaves the file as it is, so each codemod would have run on
the very bytes it was recorded on, whichever others were selected. Whether a patch is needed
is always decided from the installed vLLM's facts read in this run, as on the full path.
A needed patch with no record, another version, a changed file or another tool: the full
codemod path, which gives these answers by construction (``tests/test_fast_path.py``
compares the two on every state a file can be in).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from patcher import cache
from patcher.digest import tool
from patcher.engine.file_plan import Outcome, fact_missing, needed, not_needed, parse, transform

if TYPE_CHECKING:
    from patcher.engine.snapshot import Snapshot
    from patcher.fixes.patch import Patch

CHECKED = "checked"


def record(path: str, after: bytes, patches: tuple[Patch, ...], python_version: str) -> dict | None:
    """What each of ``patches`` written for ``path`` says about ``after`` (each codemod run
    on it alone): ``{"tool", "python", "satisfied": {id: [version, detail]}}``. Patches that
    would change it or refuse are left out. None when the tool digest is unknown. Kept in
    the controller cache too (kind ``checked``), so hosts writing the same bytes run the
    codemods once."""
    digest = tool()
    if digest is None:
        return None
    mine = [p for p in patches if p.file == path]
    key = cache.key(
        {
            "tool": digest,
            "python": python_version,
            "path": path,
            "after": hashlib.sha256(after).hexdigest(),
            "patches": [[p.id, p.version] for p in mine],
        }
    )
    with cache.locked(CHECKED, key):
        stored = cache.load(CHECKED, key)
        if isinstance(stored, dict) and stored.get("tool") == digest:
            return stored
        found = _run_alone(path, after, mine, python_version)
        made = {"tool": digest, "python": python_version, "satisfied": found}
        cache.store(CHECKED, key, made)
        return made


def _run_alone(path: str, after: bytes, patches: list[Patch], python_version: str) -> dict[str, list]:
    module = parse(path, after, python_version)
    satisfied = {}
    for patch in patches:
        verdict, _, detail = transform(patch, module)
        if verdict == "satisfied":
            satisfied[patch.id] = [patch.version, detail]
    return satisfied


def outcomes(
    snap: Snapshot, path: str, source: bytes, chosen: tuple[Patch, ...], recorded: dict[str, int]
) -> list[Outcome] | None:
    """The outcomes ``file_plan.plan_file`` would give, from the manifest's record, or None
    when the record does not answer for these bytes, patches, tool and grammar."""
    if not cache.enabled():
        return None
    entry = snap.entry(path)
    checked = entry.checked if entry is not None else None
    if not isinstance(checked, dict) or not isinstance(checked.get("satisfied"), dict):
        return None
    if entry.patched_sha256 != hashlib.sha256(source).hexdigest():
        return None
    if checked.get("python") != snap.python_version or checked.get("tool") != tool():
        return None
    if any(p.origin in ("file", "package") for p in chosen if p.file == path):
        return None  # a loaded user patch is run: its source may differ from the one the record saw
    found = []
    for patch in (p for p in chosen if p.file == path):
        gone = fact_missing(snap, patch)
        if gone:
            found.append(Outcome(patch, "fact-missing", gone))
            continue
        if not needed(snap, patch):
            found.append(Outcome(patch, "not-needed", not_needed(snap, patch)))
            continue
        rec = checked["satisfied"].get(patch.id)
        if not (isinstance(rec, list) and len(rec) == 2 and rec[0] == patch.version and isinstance(rec[1], str)):
            return None
        found.append(Outcome(patch, "applied" if patch.id in recorded else "satisfied", rec[1]))
    return found

"""``apply --adopt``: a file changed after patching is taken as the user's edit, never as
patched bytes.

The edit is what separates the file from the bytes this tool wrote there (the recorded
patches replayed on the kept pristine copy). Adopting re-bases that edit, line by line, onto
the pristine copy: the new pristine copy is stock speculators plus the edit, so ``revert``
gives back the edit without the patches. A file that holds none of the recorded patches (an
updated source, as after ``git pull`` in an editable install) is taken as it is. An edit that
overlaps the lines the patches rewrote cannot be re-based: ``apply --adopt`` refuses and says
how to keep it.
"""

from __future__ import annotations

from difflib import SequenceMatcher

from patcher.engine.file_plan import FilePlan, plan_file
from patcher.engine.plan import refusals
from patcher.engine.snapshot import Snapshot, sha256
from patcher.errors import UserError
from patcher.ways import Way


def _states(plan: FilePlan) -> list[tuple[str, str]]:
    return [(o.patch.id, o.state) for o in plan.outcomes]


def rebase(stock: bytes, patched: bytes, current: bytes) -> bytes | None:
    """``stock`` with the edit that turned ``patched`` into ``current``, line by line; None
    when a changed line of the edit is one the patches changed (or a line next to nothing
    ``stock`` has), so the edit has no place in ``stock``."""
    old, ours, theirs = (data.splitlines(keepends=True) for data in (stock, patched, current))
    untouched = SequenceMatcher(None, old, ours, autojunk=False).get_matching_blocks()
    result = list(old)
    edits = [op for op in SequenceMatcher(None, ours, theirs, autojunk=False).get_opcodes() if op[0] != "equal"]
    for _, i1, i2, j1, j2 in reversed(edits):  # from the end: earlier positions stay valid
        block = next((b for b in untouched if b.b <= i1 and i2 <= b.b + b.size), None)
        if block is None:
            return None
        start = block.a + (i1 - block.b)
        result[start : start + (i2 - i1)] = theirs[j1:j2]
    return b"".join(result)


def new_pristine(snap: Snapshot, path: str) -> bytes:
    """The pristine copy ``apply --adopt`` keeps for ``path`` (modified after patching): the
    file as it is when it holds none of the recorded patches, else the kept copy with the
    edit re-based onto it. Raises ``UserError`` naming ``revert --force`` when neither holds (the
    edit overlaps lines the patches rewrote), and a codemod's refusal as ``apply`` would."""
    entry = snap.manifest.files[path]
    current, stock = snap.files[path], snap.pristine.get(path)
    if stock is None:
        raise UserError(
            f"{snap.state_dir}: the pristine copy of {path} is missing; nothing was changed; run `{Way('repair')}`"
        )
    recorded = tuple(p for p in snap.patches.patches if p.id in entry.patches)
    on_stock = plan_file(snap, path, stock, recorded, {}, only_needed=False)
    if refusals([on_stock]):
        raise UserError(refusals([on_stock])[0])
    on_current = plan_file(snap, path, current, recorded, {}, only_needed=False)
    if _states(on_current) == _states(on_stock):  # none of the recorded patches is in it: an updated source
        return current
    if sha256(on_stock.after) == entry.patched_sha256:
        rebased = rebase(stock, on_stock.after, current)
        if rebased is not None:
            again = plan_file(snap, path, rebased, recorded, {}, only_needed=False)
            if _states(again) == _states(on_stock) and again.after == current:
                return rebased
    if refusals([on_current]):
        raise UserError(refusals([on_current])[0])
    ids = ", ".join(sorted(entry.patches))
    raise UserError(
        f"cannot adopt {path}: it holds this tool's patches ({ids}) and an edit that changes lines they "
        f"rewrote, so no pristine copy with the edit can be made, and adopting the file as it is would "
        f"keep patched code as the pristine copy; nothing was changed. To keep the edit: save the file, "
        f"`{Way('revert', ('--force',))}` (stock speculators back), make the edit again, then apply"
    )

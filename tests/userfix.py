"""A user's one-off fix, FIX001, as a patch file: the template ``speculators-patch new``
writes, filled in (the KV cache gets half of the free memory, not a fifth). Helpers write
it, and variants of it, where a test wants them."""

from __future__ import annotations

from pathlib import Path

from support import GENERATOR

from patcher.fixes.userpatches.template import render


def _fix001() -> str:
    """What a user writes in ten minutes: ``speculators-patch new FIX001 ...``'s template with
    its three constants and its title filled in."""
    source, _ = render("FIX001", GENERATOR, "fix001.py")
    edits = {
        'NAME = "CHANGE_ME"': 'NAME = "CACHE_MEMORY_FRACTION"',
        'OLD = "0"': 'OLD = "0.2"',
        'NEW = "1"': 'NEW = "0.5"',
        'title="<one line for tables>"': 'title="KV cache: half of the free memory, not a fifth"',
        'name="fix001"': 'name="kv-cache-half"',
    }
    for old, new in edits.items():
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


FIX001 = _fix001()

# What the user sees in the diff and the file: the one line FIX001 changes.
FIX001_LINE = "CACHE_MEMORY_FRACTION = 0.5  # Fraction of GPU memory for KV cache"


def write_fix001(directory: Path, name: str = "fix001.py", source: str = FIX001) -> Path:
    """Write FIX001 (or ``source``) as ``directory/name``; returns the path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(source, encoding="utf-8")
    return path


def installed_state(site: Path) -> dict:
    """What a user compares between two installs: every file's sha256 under site-packages
    and the manifest's record, without the ``checked`` entries (a cache of codemod verdicts
    ``apply`` writes for read-only commands, docs/speed.md; ``revert`` does not)."""
    import hashlib
    import json

    manifest = site / ".speculators-patch" / "manifest.json"
    files = {
        str(p.relative_to(site)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(site.rglob("*"))
        if p.is_file() and p != manifest
    }
    record = json.loads(manifest.read_text()) if manifest.exists() else None
    for entry in (record or {}).get("files", {}).values():
        entry.pop("checked", None)
    return {"files": files, "manifest": record}


# A user's fix on a file no shipped patch touches (issue 23): a header comment on
# speculators' logging utilities, as a newcomer writes it after `speculators-patch new`.
LOGGING_UTILS = "speculators/data_generation/logging_utils.py"
FIX002_HEADER = "# FIX002: reviewed for this vLLM"
FIX002 = f'''"""FIX002: a header comment on speculators' logging utilities (a file no shipped patch touches)."""
import libcst as cst

from patcher import Patch, PatchCodemod

HEADER = {FIX002_HEADER!r}


class Fix002Codemod(PatchCodemod):
    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if any(line.comment is not None and line.comment.value == HEADER for line in tree.header):
            self.already_satisfied("the header is there")
        return tree.with_changes(header=[cst.EmptyLine(comment=cst.Comment(HEADER)), *tree.header])


PATCH = Patch(id="FIX002", name="logging-header", version=1, title="logging_utils: a header comment",
              file={LOGGING_UTILS!r}, codemod=Fix002Codemod, speculators="==0.3.0", order=1000)
'''


def write_fix002(directory: Path, name: str = "fix002.py", source: str = FIX002) -> Path:
    """Write FIX002 (or ``source``) as ``directory/name``; returns the path."""
    return write_fix001(directory, name, source)

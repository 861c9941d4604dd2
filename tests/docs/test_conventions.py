"""The docs keep the docs tier's rules (docs/testing.md, "The docs tier"): commands are shown
only where a test runs them, skips are few and say why, README.md stays short, links resolve,
and no path of the machine that wrote them leaks in."""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from snapshots import ROOT, blocks, console_blocks, documents  # noqa: E402

DOCS = documents()
IDS = [str(p.relative_to(ROOT)) for p in DOCS]
MAX_SKIPPED = 8  # blocks shown but not run, in all the docs together: keep them few
COMMAND = re.compile(r"^\s*(\$ |speculators-patch\s)")


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_commands_are_shown_only_in_console_blocks(doc):
    """A `$ ` line or a `speculators-patch ...` line outside a ```console block would be a
    command no test runs (a ```text block holds a recorded output, whose rows may start with
    the tool's name)."""
    stray = [
        f"{block.where}: {line.strip()}"
        for block in blocks(doc)
        if block.info != "console"
        for line in block.body
        if COMMAND.match(line) and not (block.info == "text" and line[0] != "$")
    ]
    assert not stray, "commands outside ```console blocks (the docs tier runs only those):\n" + "\n".join(stray)


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_console_block_parses(doc):
    for block in console_blocks(doc):
        assert block.commands(), f"{block.where}: a console block without a `$ ` command"


def test_skipped_blocks_are_few_and_say_why():
    skipped = [b for doc in DOCS for b in console_blocks(doc) if b.skip is not None]
    assert all(b.skip for b in skipped), [b.where for b in skipped if not b.skip]
    assert len(skipped) <= MAX_SKIPPED, [f"{b.where}: {b.skip}" for b in skipped]


def test_readme_fits_and_names_the_commands_a_user_needs_first():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    first = "\n".join(lines[:60])
    assert "pip install ." in first and "speculators-patch apply --target" in first
    # The README's test command is the one CI runs.
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert any(line.startswith("make test ") for line in lines)


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_no_path_of_this_machine(doc):
    text = doc.read_text(encoding="utf-8")
    found = re.findall(r"(?:\.\./shared/|/work/|/tmp/|/root/)\S*", text)
    assert not found, found


def _slug(heading: str, seen: dict[str, int]) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"`|\*\*|\[([^]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    slug = text.replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    return slug if n == 0 else f"{slug}-{n}"


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    in_fence = False
    anchors = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            in_fence = not in_fence
        elif not in_fence and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            anchors.add(_slug(m.group(1), seen))
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_relative_links_and_anchors_resolve(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, broken

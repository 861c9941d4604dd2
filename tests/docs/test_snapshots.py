"""Every command shown in README.md and docs/*.md runs, and prints what is shown under it.

The convention and the comparison: ``snapshots.py``. One test per Markdown file (its blocks run
in order in one working directory, on real sandboxes built from the real wheels by
fixtures/sandbox.py); blocks that need the vLLM CPU engine run in the engine tier.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from snapshots import ROOT, Session, console_blocks, documents  # noqa: E402


def _runnable(engine: bool) -> list[Path]:
    return [doc for doc in documents() if any(b.skip is None and b.engine == engine for b in console_blocks(doc))]


def _run(doc: Path, engine: bool) -> None:
    # A short directory: rich wraps long paths, and the shown output names it /home/me/speculators-patch.
    session = Session(Path(tempfile.mkdtemp(prefix="docs-")))
    problems: list[str] = []
    try:
        for block in console_blocks(doc):
            if block.skip is None and block.engine == engine:
                problems += session.run(block)
    finally:
        session.close()
    assert not problems, "shown output differs from the real one:\n\n" + "\n\n".join(problems)


@pytest.mark.parametrize("doc", _runnable(engine=False), ids=lambda p: str(p.relative_to(ROOT)))
def test_shown_commands_print_what_is_shown(doc):
    _run(doc, engine=False)


@pytest.mark.engine
@pytest.mark.parametrize("doc", _runnable(engine=True), ids=lambda p: str(p.relative_to(ROOT)))
def test_shown_engine_commands_print_what_is_shown(doc):
    _run(doc, engine=True)

"""docs/patches.md shows the patch table as the registry has it (regenerate:
``python tests/docs/patches_doc.py --write``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

sys.path.insert(0, str(Path(__file__).resolve().parent))

import patches_doc  # noqa: E402


def test_docs_patches_is_current():
    shown = patches_doc.shown(patches_doc.DOC.read_text(encoding="utf-8"))
    assert shown == patches_doc.table(), "docs/patches.md is out of date: run python tests/docs/patches_doc.py --write"


def test_every_shipped_patch_has_a_row_and_a_module():
    rows = [line for line in patches_doc.table().splitlines()[2:]]
    ids = {p.id for p in patches_doc.shipped_patches()}
    assert len(rows) == len(ids)
    for patch_id in ids:
        assert (patches_doc.DOC.parent / patches_doc._module(patch_id)).resolve().is_file()

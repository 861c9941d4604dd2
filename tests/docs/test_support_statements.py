"""Issue 46: the support statements (README.md, docs/matrix.md, ``list``) agree, made by one
place (``patcher/fixes/support.py``), and that place says what the tests run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import test_speculators_04
from matrix_doc import RELEASES as MATRIX_RELEASES
from support import run_cli, run_json

from patcher.fixes import support
from patcher.fixes.registry import shipped_patches

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[2]
MARKED = re.compile(r"<!-- support -->(.*?)<!-- /support -->", re.S)


def _minor(release: str) -> str:
    return ".".join(release.split(".")[:2])


@pytest.mark.parametrize("doc", ["README.md", "docs/matrix.md"])
def test_each_document_says_the_one_support_statement(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert MARKED.findall(text) == [support.sentence()], (
        f"{doc}: its support statement is not patcher.fixes.support.sentence()"
    )
    outside = MARKED.sub("", text)
    if doc == "README.md":  # no other range claimed for a speculators line
        assert "0.11–0.34" not in outside and "0.12–0.17" not in outside


def test_list_says_it_too():
    text = run_cli("list")
    assert text.returncode == 0 and text.stdout.splitlines()[-1] == f"supported: {support.sentence()}"
    code, data = run_json("list")  # --json: the rows, each with the releases its patch is written for
    rows = {r["id"]: r for r in data}
    assert rows["SP019"]["speculators"] == ["0.3.0", "0.4.0", "0.4.0.1"]
    assert rows["SP001"]["speculators"] == ["0.3.0"] and rows["SP015"]["speculators"] == ["0.4.0", "0.4.0.1"]


def test_the_ranges_are_what_the_tests_run():
    line_03, line_04 = support.LINES
    assert line_03.releases == ("0.3.0",)
    assert line_03.vllm == (_minor(MATRIX_RELEASES[0]), _minor(MATRIX_RELEASES[-1]))
    combos = test_speculators_04.COMBINATIONS
    assert set(line_04.releases) == {s for s, _ in combos}
    minors = sorted({_minor(v) for _, v in combos}, key=lambda m: tuple(map(int, m.split("."))))
    assert line_04.vllm == (minors[0], minors[-1])


def test_every_release_has_patches_and_every_patch_a_release():
    specifiers = sorted({p.speculators for p in shipped_patches()})
    assert support.releases_for(specifiers) == list(support.RELEASES)
    for patch in shipped_patches():
        assert support.releases_for([patch.speculators]), patch.id

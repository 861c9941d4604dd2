"""Every shipped patch has its codemod shown as strings: at least one rewrite (``before`` ->
``after``) and one refusal (``source`` -> the reason), in the ``REWRITES`` and ``REFUSALS``
lists of the ``tests/patches/test_*.py`` modules (tests/codemods.py). A patch added to
``patches/`` without them fails here; the lists are read from the registry's patches, not
from a list of ids kept here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from patcher.fixes.registry import shipped_patches

pytestmark = pytest.mark.fast

HERE = Path(__file__).resolve().parent
SHAPES = {"REWRITES": 3, "NOOPS": 2, "REFUSALS": 3}  # (patch id, before, after), (id, source), (id, source, reason)


def cases() -> dict[str, list[tuple[str, object]]]:
    """Each list name -> (module, param) of every ``tests/patches/test_*.py`` module."""
    found: dict[str, list[tuple[str, object]]] = {name: [] for name in SHAPES}
    for path in sorted(HERE.glob("test_*.py")):
        module = importlib.import_module(path.stem)
        for name in SHAPES:
            found[name] += [(path.stem, case) for case in getattr(module, name, ())]
    return found


def test_every_case_is_a_patch_id_and_strings():
    """Pure string pairs: no fixture, no file, nothing but the patch id and source text."""
    wrong = [
        f"{module}.{name}: {case.id}"
        for name, listed in cases().items()
        for module, case in listed
        if len(case.values) != SHAPES[name]
        or not all(isinstance(v, str) for v in case.values)
        or not re.fullmatch(r"SP\d{3}", case.values[0])
    ]
    assert wrong == []


def test_every_shipped_patch_has_a_rewrite_and_a_refusal():
    found = cases()
    shipped = {p.id for p in shipped_patches()}
    rewritten = {case.values[0] for _, case in found["REWRITES"]}
    refused = {case.values[0] for _, case in found["REFUSALS"]}
    assert sorted(shipped - rewritten) == [], "patches without a rewrite pair in REWRITES"
    assert sorted(shipped - refused) == [], "patches without a refusal pair in REFUSALS"
    assert (rewritten | refused) <= shipped, "a pair names a patch that is not shipped"

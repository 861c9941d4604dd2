"""``verify``'s checks are one list (``patcher.checks.checklist.checks``): each implements the
same protocol, ``commands.verify`` loops over them, and one function of the tool is named
``verify`` (the verb). Read from the code itself; no target is read."""

from __future__ import annotations

import ast
import re

import pytest
from support import ROOT

from patcher.checks.check import Check
from patcher.checks.checklist import checks

pytestmark = pytest.mark.fast


def test_one_function_is_named_verify():
    defined = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "patcher").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef) and node.name == "verify"
    ]
    assert defined == ["patcher/commands/verify.py:" + defined[0].rsplit(":", 1)[1]]


def test_every_check_implements_the_protocol_once():
    listed = checks()
    assert all(isinstance(c, Check) for c in listed)
    keys = [c.key for c in listed]
    assert len(set(keys)) == len(keys) and all(keys)
    assert all(c.failing for c in listed), "every check says its words in verify: FAILED (...)"
    assert "lifecycle" in keys, "the life-cycle check is one of the list"


def test_the_verb_names_no_check_of_its_own():
    """``commands/verify.py`` and the CLI's report loop over the list: no check module is
    imported there, so a new check is its own module plus its line in ``checks()``."""
    for path in ("patcher/commands/verify.py", "patcher/cli/reports.py", "patcher/cli/render.py"):
        text = (ROOT / path).read_text(encoding="utf-8")
        named = re.findall(r"from patcher\.checks(?:\.(\w+))? import (\w+)", text)
        assert {module or name for module, name in named} <= {"check", "checklist", "verify"}, path
        assert "lifecycle" not in text, path

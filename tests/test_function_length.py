"""No function in patcher/ runs over 80 lines (its ``def`` line to its last, decorators aside):
a longer one is split into named steps a newcomer can read one at a time."""

from __future__ import annotations

import ast

import pytest
from support import ROOT

pytestmark = pytest.mark.fast

MAX_LINES = 80


def test_no_function_in_patcher_is_longer_than_80_lines():
    long = []
    for path in sorted((ROOT / "patcher").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} has {lines} lines")
    assert not long, "\n".join(long)

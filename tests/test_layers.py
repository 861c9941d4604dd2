"""The layering docs/ARCHITECTURE.md describes, read from the imports themselves: each folder
imports only folders below it, the controller reaches into ``patcher/agent/`` only through
what both sides run, the agent imports the standard library only, and no module takes
another module's underscore-private name."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from support import ROOT

pytestmark = pytest.mark.fast

PATCHER = ROOT / "patcher"

# Higher imports lower, never the reverse (``patcher/__init__.py`` is the public API on top).
RANK = {
    "__main__": 9,
    "__init__": 8,
    "cli": 7,
    "commands": 6,
    "checks": 5,
    "engine": 4,
    "fixes": 3,
    "connect": 3,
    "agent": 2,
    "cache": 1,
    "digest": 1,
    "errors": 0,
    "states": 0,
    "ways": 0,
}

# What the controller may import from ``patcher/agent/``: the modules both sides run (the
# parser, the rule that makes a target an interpreter, what a manifest must look like) and selftest's check, which
# ``commands.selftest`` ships to the target.
SHARED = {
    "patcher.agent.pysource": {"checks"},
    "patcher.agent.bootstrap": {"connect"},
    "patcher.agent.manifest_rules": {"fixes"},
    "patcher.agent.selftest": {"commands"},
}


def _modules(*folders: Path):
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def _unit(path: Path) -> str:
    """The folder (or top-level module) of ``patcher/`` a file belongs to."""
    return path.relative_to(PATCHER).parts[0].removesuffix(".py")


def _imported(tree: ast.Module) -> list[tuple[str, list[str], int]]:
    """(absolute module, names, line) of every ``patcher`` import, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("patcher"):
            found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("patcher")]
    return found


def _targets(module: str, names: list[str]) -> list[str]:
    """The units an import reaches: ``from patcher import engine`` reaches ``engine``."""
    parts = module.split(".")
    if len(parts) > 1:
        return [parts[1]]
    return [n for n in names if n in RANK]


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path, tree in _modules(PATCHER):
        unit = _unit(path)
        for module, names, line in _imported(tree):
            for target in _targets(module, names):
                if target != unit and RANK[target] >= RANK[unit]:
                    upward.append(f"{path.relative_to(ROOT)}:{line}: {unit} imports {module} ({target})")
    assert upward == []


def test_the_controller_reaches_the_agent_only_through_what_both_sides_run():
    reached = []
    for path, tree in _modules(PATCHER):
        unit = _unit(path)
        if unit == "agent":
            continue
        for module, names, line in _imported(tree):
            if module == "patcher.agent":  # ``from patcher.agent import bootstrap``
                module = "patcher.agent." + names[0] if len(names) == 1 else module
            if module == "patcher.agent" or module.startswith("patcher.agent."):
                shared = next((s for s in SHARED if module == s or module.startswith(s + ".")), None)
                if shared is None or unit not in SHARED[shared]:
                    reached.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert reached == []


def test_architecture_names_what_the_controller_imports_from_the_agent():
    """docs/ARCHITECTURE.md's agent row names the agent modules the controller imports: each
    one it does import (``SHARED``), and no other."""
    imported = set()
    for path, tree in _modules(PATCHER):
        if _unit(path) != "agent":
            for module, names, _ in _imported(tree):
                if module == "patcher.agent":
                    module = "patcher.agent." + names[0] if len(names) == 1 else module
                imported |= {s for s in SHARED if module == s or module.startswith(s + ".")}
    assert imported == set(SHARED), "SHARED names an agent module the controller no longer imports"
    row = next(
        line
        for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines()
        if line.startswith("| `patcher/agent/`")
    )
    said = row.split("The controller imports ", 1)[1].split(", and nothing else here", 1)[0]
    assert set(re.findall(r"`(\w+)(?:\.py|/)`", said)) == {s.rsplit(".", 1)[1] for s in SHARED}


def test_the_agent_imports_the_standard_library_only():
    """The agent, its loader and the bootstrap run under the target's interpreter, where
    nothing of ours is installed (selftest's check and the runtime probe use the target's
    torch, transformers and vLLM, in a child process of the agent)."""
    from patcher.connect.program import AGENT, AGENT_MODULES

    foreign = []
    for name in (*AGENT_MODULES, "loader", "bootstrap"):
        path = AGENT / f"{name}.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = [(node.module or "").split(".")[0]]
            elif isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            else:
                continue
            foreign += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {t}" for t in tops if t not in sys.stdlib_module_names
            ]
    assert foreign == []


def test_no_module_imports_an_underscore_private_name_of_another():
    private = []
    for path, tree in _modules(PATCHER, ROOT / "patches", ROOT / "ansible"):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                private += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert private == []


def test_the_agent_parses_as_python_3_8():
    """The oldest Python a target may have; ruff's formatter is told so too (pyproject.toml)."""
    from patcher.connect.program import AGENT

    for path in sorted(AGENT.rglob("*.py")):
        ast.parse(path.read_text(encoding="utf-8"), str(path), feature_version=(3, 8))

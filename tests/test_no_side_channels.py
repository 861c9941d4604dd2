"""What one layer hands another goes by value: read from the code itself, the controller writes
no environment variable to carry an option, no module's mutable global is changed and read
from another module, and the transport is only the pipe (what a run queues, holds and was
answered lives in its ``connect.session.Session``)."""

from __future__ import annotations

import ast

import pytest
from support import ROOT

pytestmark = pytest.mark.fast

PATCHER = ROOT / "patcher"
# Calls that change a list, dict or set in place.
MUTATORS = {"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "add", "remove", "discard"}


def _controller_modules():
    """(dotted name, tree) of every module that runs on the controller (``patcher/agent/``
    runs on the target, in its own process) and of the Ansible collection."""
    for path in sorted([*PATCHER.rglob("*.py"), *(ROOT / "ansible").rglob("*.py")]):
        if "agent" in path.relative_to(ROOT).parts[:2]:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        yield name, path, ast.parse(path.read_text(encoding="utf-8"))


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def test_the_controller_writes_no_environment_variable():
    """An option (``--no-cache``) reaches the code that honours it as a value, not through
    ``os.environ``; the environments given to child processes are copies."""
    writes = []
    for _, path, tree in _controller_modules():
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets):
                writes.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS | {"putenv"}
                and (_is_environ(node.func.value) or node.func.attr == "putenv")
            ):
                writes.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert writes == []


def _module_globals(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _changed_after_import(tree: ast.Module, names: set[str]) -> set[str]:
    """Module-level names the module itself changes once loaded: rebound through ``global``,
    changed in place by a method call, an item assignment or an augmented assignment."""
    changed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            changed |= names & set(node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            changed |= {node.func.value.id} & names if isinstance(node.func.value, ast.Name) else set()
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                base = target.value if isinstance(target, ast.Subscript) else None
                if isinstance(node, ast.AugAssign) and isinstance(target, ast.Name):
                    base = target
                changed |= {base.id} & names if isinstance(base, ast.Name) else set()
    return changed


def test_no_mutable_global_is_read_from_another_module():
    """A module-level name that changes after import (a run's state) stays in its module: no
    other module imports it or reads it as an attribute of the module."""
    modules = {name: (path, tree) for name, path, tree in _controller_modules()}
    changing = {name: _changed_after_import(tree, _module_globals(tree)) for name, (path, tree) in modules.items()}
    changing = {name: names for name, names in changing.items() if names}
    read = []
    for name, (path, tree) in modules.items():
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in changing and node.module != name:
                read += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name in changing[node.module]
                ]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    if f"{node.module}.{a.name}" in changing:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in changing and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                module = aliases.get(node.value.id)
                if module and module != name and node.attr in changing[module]:
                    read.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module}.{node.attr}")
    assert read == []


def test_the_transport_carries_no_request_answer_or_lock():
    """``Transport`` is the pipe to one agent: nothing of a run (requests queued to ride on
    another, their answers, cache locks held, commits seen) is kept on it or in its module."""
    from patcher.connect import transport
    from patcher.connect.session import Session
    from patcher.connect.transport import Transport

    pipe = Transport()
    kept = {name for name in vars(pipe) if any(w in name for w in ("ahead", "answer", "held", "queue", "commit"))}
    assert kept == set() and not hasattr(pipe, "send_ahead")
    assert not [n for n, v in vars(transport).items() if not n.startswith("__") and isinstance(v, (list, dict, set))]
    session = Session(pipe)
    assert {"queued", "answers", "held", "written"} <= set(vars(session))

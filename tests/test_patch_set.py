"""Issue 38, item 1: a run's patches are a value (``PatchSet``), built per target; nothing in
``patcher/fixes/registry.py`` changes after it is first read, so one target's recorded user
patches never reach another target read in the same process (a fan-out's threads, an
Ansible worker, a test run)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import types
from pathlib import Path

import pytest

from patcher.errors import UserError
from patcher.fixes import registry
from patcher.fixes.manifest import Manifest
from patcher.fixes.registry import PatchSet, loaded

SHIPPED_FILE = loaded().patches[0].file


def recording(pid: str) -> Manifest:
    """A manifest recording user patch ``pid`` on the first shipped patch's file."""
    return Manifest.parse(
        {
            "files": {SHIPPED_FILE: {"pristine_sha256": "0" * 64, "patched_sha256": "1" * 64, "patches": {pid: 1}}},
            "user_patches": {pid: {"origin": "file", "source": f"/elsewhere/{pid.lower()}.py", "title": f"fix {pid}"}},
        }
    )


@pytest.mark.fast
def test_a_recorded_user_patch_joins_a_new_set_and_leaves_the_one_it_came_from_alone():
    run = loaded()
    one, two = run.with_recorded(recording("FIX001")), run.with_recorded(recording("FIX002"))
    assert "FIX001" in one.ids() and "FIX002" not in one.ids()
    assert "FIX002" in two.ids() and "FIX001" not in two.ids()
    assert not {"FIX001", "FIX002"} & run.ids() and not {"FIX001", "FIX002"} & loaded().ids()
    assert one.by_id()["FIX001"].origin == "recorded" and one.user_patches() == ()  # nameable, not runnable
    assert run.with_recorded(None) is run and run.with_recorded(Manifest.parse_tolerant({"files": "not a map"})) is run


@pytest.mark.fast
def test_selection_is_the_sets_own():
    one = loaded().with_recorded(recording("FIX001"))
    assert [p.id for p in one.select(("fix001",))] == ["FIX001"]
    with pytest.raises(UserError, match="unknown patch id FIX001"):
        loaded().select(("FIX001",))


def test_two_targets_read_in_one_process_get_their_own_recorded_patches(sandbox: Path):
    """What ``read_snapshot`` recorded used to join one process-wide registry (``add_recorded``):
    the second target could then name the first target's user patch."""
    from patcher import engine
    from patcher.connect.local import LocalTransport

    def target(pid: str | None) -> LocalTransport:
        transport = LocalTransport(str(sandbox))
        real = transport.request

        def request(op, **payload):
            answer = real(op, **payload)
            if op == "inspect" and pid is not None:
                answer["manifest"] = recording(pid).as_dict()  # as if that target had the user patch applied
            return answer

        transport.request = request
        return transport

    snaps = {}
    for pid in ("FIX001", "FIX002", None):
        with target(pid) as transport:
            snaps[pid] = engine.read_snapshot(transport)
    assert "FIX001" in snaps["FIX001"].patches.ids() and "FIX002" not in snaps["FIX001"].patches.ids()
    assert "FIX002" in snaps["FIX002"].patches.ids() and "FIX001" not in snaps["FIX002"].patches.ids()
    assert not {"FIX001", "FIX002"} & snaps[None].patches.ids()
    with pytest.raises(UserError, match="unknown patch id FIX001"):
        snaps["FIX002"].patches.select(("FIX001",))
    assert not {"FIX001", "FIX002"} & loaded().ids()


MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "bytearray"}


@pytest.mark.fast
def test_the_registry_module_keeps_no_state_that_changes_after_import():
    """No ``global`` statement, no module-level dict/list/set, and building patch sets leaves
    every module-level name as it was: the only caches are the read-once ``lru_cache`` of the
    shipped patches and of the installed packs."""
    source = Path(inspect.getfile(registry)).read_text(encoding="utf-8")
    tree = ast.parse(source)
    assert not [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Global, ast.Nonlocal))]
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
            isinstance(value, ast.Call) and getattr(value.func, "id", None) in MUTABLE_CALLS
        )
        assert not mutable, f"registry.py:{node.lineno}: module-level mutable value"
    immutable = (str, int, float, bool, bytes, tuple, frozenset, type(None), re.Pattern)
    kinds = (types.ModuleType, types.FunctionType, type)
    for name, value in vars(registry).items():
        if name.startswith("__") or name == "annotations" or isinstance(value, kinds) or hasattr(value, "cache_info"):
            continue
        assert isinstance(value, immutable), f"registry.{name} is a {type(value).__name__}"
    before = dict(vars(registry))
    loaded().with_recorded(recording("FIX001")).select(("FIX001",))
    assert dict(vars(registry)) == before
    assert [c for c in (registry.shipped_patches, registry.installed_packs) if c.cache_info().maxsize != 1] == []


@pytest.mark.fast
def test_a_patch_set_cannot_be_changed_in_place():
    patches = loaded()
    with pytest.raises(dataclasses.FrozenInstanceError):
        patches.patches = ()  # type: ignore[misc]
    assert isinstance(patches.patches, tuple) and isinstance(patches, PatchSet)
    patches.by_id().clear()
    assert patches.by_id()

"""Generic checks over every registered patch, on the real speculators 0.3.0 sources."""

from __future__ import annotations

import pytest
from packaging.version import Version

from patcher.engine import run_codemod
from patcher.registry import all_patches

PATCHES = all_patches()


def apply_in_order(sources: dict[str, bytes], patches) -> dict[str, bytes]:
    out = dict(sources)
    for patch in patches:
        verdict, new, detail = run_codemod(patch, out[patch.file])
        assert verdict in ("changed", "satisfied"), f"{patch.id}: {detail}"
        out[patch.file] = new
    return out


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_metadata_is_complete(patch):
    module = __import__(patch.codemod.__module__, fromlist=["_"])
    assert module.__doc__ and module.__doc__.startswith(f"{patch.id}:"), "docstring opens with the id"
    assert patch.codemod.DESCRIPTION
    assert patch.name.replace("-", "_") in module.__name__, "module is named after the patch"
    for fact in patch.facts:
        assert fact.modules and all(m.startswith("vllm/") and m.endswith(".py") for m in fact.modules)
        Version(fact.first_release)


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_alone_on_pristine_changes_then_is_satisfied(patch, pristine_sources):
    verdict, once, _ = run_codemod(patch, pristine_sources[patch.file])
    assert verdict == "changed"
    compile(once, patch.file, "exec")
    verdict, twice, detail = run_codemod(patch, once)
    assert verdict == "satisfied" and twice == once and detail.startswith("already satisfied")


def test_all_in_order_compiles_and_is_a_fixed_point(pristine_sources):
    once = apply_in_order(pristine_sources, PATCHES)
    for path, data in once.items():
        compile(data, path, "exec")
    for patch in PATCHES:
        assert run_codemod(patch, once[patch.file])[0] == "satisfied", patch.id
    assert apply_in_order(once, PATCHES) == once


def test_order_is_explicit_and_unique_per_file():
    for path in {p.file for p in PATCHES}:
        orders = [p.order for p in PATCHES if p.file == path]
        assert len(orders) == len(set(orders)), f"two patches share an order in {path}"


def test_line_endings_and_comments_survive(pristine_sources):
    crlf = {k: v.replace(b"\n", b"\r\n") for k, v in pristine_sources.items()}
    patched = apply_in_order(crlf, PATCHES)
    for path, data in patched.items():
        assert b"\n" not in data.replace(b"\r\n", b""), f"{path}: a bare LF was introduced"
    assert b"# Constants" in patched["speculators/data_generation/vllm_hidden_states_generator.py"]


def test_required_patches_are_selected_together():
    from patcher.errors import UserError
    from patcher.registry import select

    dependent = next(p for p in PATCHES if p.requires)
    with pytest.raises(UserError, match=f"{dependent.id} requires"):
        select(only=(dependent.id,))
    with pytest.raises(UserError, match=f"{dependent.id} requires {dependent.requires[0]}"):
        select(skip=(dependent.requires[0],))
    with pytest.raises(UserError, match=f"{dependent.id} require\\(s\\) {dependent.requires[0]}"):
        select(only=(dependent.requires[0],))
    assert {dependent.id, *dependent.requires} <= {p.id for p in select(only=(dependent.id, *dependent.requires))}

"""Generic checks over every registered patch, on the real sources of the speculators
release it is written for (0.3.0; 0.4.0.1, whose data_generation files 0.4.0 shares)."""

from __future__ import annotations

import ast
import json
import re
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest
from packaging.version import Version
from support import run_cli

from patcher.engine import run_codemod, written_for
from patcher.fixes.registry import loaded

PATCHES = loaded().patches
RELEASES = ("0.3.0", "0.4.0.1")
BY_RELEASE = {release: written_for(release, PATCHES) for release in RELEASES}


@lru_cache(maxsize=None)
def release_sources(release: str) -> dict[str, bytes]:
    """The files the patches written for ``release`` touch, read from its real wheel."""
    from sandbox import wheel

    with zipfile.ZipFile(wheel("speculators", release)) as z:
        return {p.file: z.read(p.file) for p in BY_RELEASE[release]}


def release_of(patch) -> str:
    return next(r for r in RELEASES if patch in BY_RELEASE[r])


def requirements(patch) -> set:
    """The patches ``patch`` requires, directly or through another."""
    found, queue = set(), list(patch.requires)
    while queue:
        wanted = queue.pop()
        required = next(p for p in PATCHES if p.id == wanted)
        if required not in found:
            found.add(required)
            queue += required.requires
    return found


def apply_in_order(sources: dict[str, bytes], patches) -> dict[str, bytes]:
    out = dict(sources)
    for patch in patches:
        verdict, new, detail = run_codemod(patch, out[patch.file])
        assert verdict in ("changed", "satisfied"), f"{patch.id}: {detail}"
        out[patch.file] = new
    return out


@pytest.mark.fast
@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_metadata_is_complete(patch):
    module = __import__(patch.codemod.__module__, fromlist=["_"])
    assert module.__doc__ and module.__doc__.startswith(f"{patch.id}:"), "docstring opens with the id"
    assert patch.codemod.DESCRIPTION
    assert patch.name.replace("-", "_") in module.__name__, "module is named after the patch"
    for fact in patch.facts:
        # One library per fact: vLLM, or (the training half) transformers or torch.
        assert fact.library in ("vllm", "transformers", "torch")
        assert fact.modules and all(m.startswith(f"{fact.library}/") and m.endswith(".py") for m in fact.modules)
        Version(fact.first_release)
    # What a patch depends on is in its declaration: a vLLM fact, or in words (``list``).
    if patch.facts:
        assert not patch.depends_on
    elif "eos_token_id" in patch.name or "kv-cache" in patch.name:  # they read vLLM at run time
        assert "vllm/" in patch.depends_on and patch.portable


@pytest.mark.fast
def test_list_names_what_each_patch_depends_on():
    listed = {r["id"]: r for r in json.loads(run_cli("list", "--json").stdout)}
    assert "vllm/config/cache.py" in listed["SP021"]["depends_on"] and listed["SP021"]["facts"] == []
    assert listed["SP010"]["depends_on"] == "" and listed["SP004"]["facts"]
    assert listed["SP012"]["requires"] == ["SP010"] and listed["SP024"]["requires"] == ["SP020"]
    assert listed["SP010"]["requires"] == []
    text = run_cli("list").stdout
    assert "speculators' own logic" in text and "at run time" in text


@pytest.mark.fast
def test_every_patch_is_written_for_a_release_tested_here():
    assert {p.id for p in PATCHES} == {p.id for r in RELEASES for p in BY_RELEASE[r]}
    assert all(BY_RELEASE.values())


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_alone_on_pristine_changes_then_is_satisfied(patch):
    """Alone, or after the patches of the same file it requires, directly or through another
    (SP022 rewrites SP010's code, SP027 SP022's)."""
    source = release_sources(release_of(patch))[patch.file]
    for required in sorted(requirements(patch), key=lambda p: p.order):
        if required.file == patch.file:
            source = run_codemod(required, source)[1]
    verdict, once, _ = run_codemod(patch, source)
    assert verdict == "changed"
    compile(once, patch.file, "exec")
    verdict, twice, detail = run_codemod(patch, once)
    assert verdict == "satisfied" and twice == once and detail.startswith("already satisfied")


@pytest.mark.parametrize("release", RELEASES)
def test_all_in_order_compiles_and_is_a_fixed_point(release):
    patches = BY_RELEASE[release]
    once = apply_in_order(release_sources(release), patches)
    for path, data in once.items():
        compile(data, path, "exec")
    for patch in patches:
        assert run_codemod(patch, once[patch.file])[0] == "satisfied", patch.id
    assert apply_in_order(once, patches) == once


@pytest.mark.fast
@pytest.mark.parametrize("release", RELEASES)
def test_order_is_explicit_and_unique_per_file(release):
    patches = BY_RELEASE[release]
    for path in {p.file for p in patches}:
        orders = [p.order for p in patches if p.file == path]
        assert len(orders) == len(set(orders)), f"two patches share an order in {path}"


@pytest.mark.fast
def test_a_patch_orders_after_what_it_requires_in_its_file():
    """``order`` and ``requires`` say one thing: a patch that requires another on the same
    file runs after it (SP022 rewrites what SP010 wrote); on another file order has no say."""
    by_id = {p.id: p for p in PATCHES}
    before = [
        f"{p.id} (order {p.order}) requires {r} (order {by_id[r].order})"
        for p in PATCHES
        for r in p.requires
        if by_id[r].file == p.file and by_id[r].order >= p.order
    ]
    assert before == []
    assert all(r in by_id for p in PATCHES for r in p.requires)


@pytest.mark.parametrize("release", RELEASES)
def test_line_endings_and_comments_survive(release):
    crlf = {k: v.replace(b"\n", b"\r\n") for k, v in release_sources(release).items()}
    patched = apply_in_order(crlf, BY_RELEASE[release])
    for path, data in patched.items():
        assert b"\n" not in data.replace(b"\r\n", b""), f"{path}: a bare LF was introduced"
    assert b"# Constants" in patched["speculators/data_generation/vllm_hidden_states_generator.py"]


@pytest.mark.fast
def test_required_patches_are_selected_together():
    """apply keeps a chosen patch's requirements (``keep="requires"``), revert its dependents
    (``"dependents"``); tests/test_selection.py has the exact messages."""
    from patcher.errors import UserError

    select = loaded().select

    dependent = next(p for p in PATCHES if p.requires)
    with pytest.raises(UserError, match=f"{dependent.id} requires"):
        select(only=(dependent.id,), keep="requires")
    with pytest.raises(UserError, match=f"{dependent.id} requires {dependent.requires[0]}"):
        select(skip=(dependent.requires[0],), keep="requires")
    with pytest.raises(UserError, match=f"(SP\\d+, )*{dependent.id}(, SP\\d+)* require\\(s\\) {dependent.requires[0]}"):
        select(only=(dependent.requires[0],), keep="dependents")
    # Together: the requirement and every patch that requires it, directly or through another
    # (SP010 with SP012, SP022 and SP027).
    group = {dependent.id, *dependent.requires}
    while True:
        more = {p.id for p in PATCHES if set(p.requires) & group} | {
            r for p in PATCHES if p.id in group for r in p.requires
        }
        if more <= group:
            break
        group |= more
    for keep in ("requires", "dependents", None):
        assert group <= {p.id for p in select(only=tuple(sorted(group)), keep=keep)}


@pytest.mark.fast
def test_what_a_patch_is_for_is_a_field_of_its_record():
    """The tool finds a patch by what it does (``runner_batch``, ``attribution``, ``uncovered``),
    and the patch index (fast paths) keeps those fields."""
    from patcher.fixes import patch_index

    for release in RELEASES:
        assert len([p for p in BY_RELEASE[release] if p.checks.runner_batch == "v2"]) <= 1
    assert [p.id for p in BY_RELEASE["0.3.0"] if p.checks.runner_batch == "v2"] == ["SP022"]
    assert sorted(p.id for p in PATCHES if p.checks.attribution) == ["SP010", "SP012", "SP022"]
    assert [(p.id, u.speculators) for p in PATCHES for u in p.checks.uncovered] == [("SP023", "~=0.4.0")]
    rows = patch_index.dump(PATCHES, {p.id: p.codemod.__module__ for p in PATCHES})
    assert rows is not None
    for old, new in zip(PATCHES, patch_index.build(json.loads(json.dumps(rows))), strict=True):
        assert new.checks == old.checks
    help_text = " ".join(run_cli("apply", "--help").stdout.split())
    assert "e.g. without SP010, SP012 and SP022 hidden states can be attributed to the wrong request." in help_text


# Docstrings in patcher/ that show an id's form by example, not knowledge of that patch.
ID_EXAMPLES = {
    ("patcher/fixes/patch.py", "(``SP001`` ...)"),
    ("patcher/fixes/registry.py", "name SP004 and FIX001"),
}


@pytest.mark.fast
def test_the_tool_names_no_patch_by_id():
    """Everything the tool knows about a patch is a field of its ``Patch`` record (set in
    ``patches/``): no ``SPnnn`` id in patcher/ but the examples above."""
    root = Path(__file__).resolve().parents[2]
    token = re.compile(r"\bSP0\d\d\b")
    found = []
    for path in sorted((root / "patcher").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if token.search(line) and not any(name == f and example in line for f, example in ID_EXAMPLES):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def _modules_reached(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names, without the ``speculators_patch_codemods.``
    prefix: ``from speculators_patch_codemods import capture_methods`` names ``capture_methods``."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif (node.module or "") in ("", "speculators_patch_codemods"):
        names = [a.name for a in node.names]
    else:
        names = [node.module]
    return [n.removeprefix("speculators_patch_codemods.") for n in names]


@pytest.mark.fast
def test_no_patch_imports_another_patch():
    """What several patches share (a template one writes and another recognises, a codemod two
    releases' patches run) lives in a module of ``patches/`` that is no patch
    (``capture_methods``, ...): editing one patch never silently changes another."""
    root = Path(__file__).resolve().parents[2] / "patches"
    found = [
        f"patches/{path.name}:{node.lineno}: imports {name}"
        for path in sorted(root.glob("sp*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for name in _modules_reached(node)
        if re.match(r"sp\d{3}_", name)
    ]
    assert not found, "\n".join(found)

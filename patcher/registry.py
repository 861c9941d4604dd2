"""The patch registry: every ``PATCH`` defined in ``patches/``, validated and ordered.

``patches/`` ships as the package ``speculators_patch_codemods`` (see pyproject.toml);
dropping a module there registers it. Once the modules have been imported and checked, their
metadata is kept in the patch index (``patcher.patch_index``), so later runs that run no
codemod do not import libcst.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import lru_cache

from packaging.specifiers import SpecifierSet

from patcher import cache, patch_index
from patcher.errors import UserError
from patcher.patch import Patch

PACKAGE = "speculators_patch_codemods"
_ID = re.compile(r"^SP\d{3}$")


@lru_cache(maxsize=1)
def all_patches() -> tuple[Patch, ...]:
    """Every registered patch, ordered by (file, order). Raises ``RuntimeError`` on bad metadata.

    From the patch index when it holds this exact code (codemods imported on first use),
    else by importing every module (and then the index is written)."""
    digest = patch_index.tool_digest(PACKAGE) if cache.enabled() else None
    indexed = patch_index.load(digest)
    if indexed is not None:
        return indexed
    patches, modules = _import_all()
    patch_index.save(digest, patches, modules)
    return patches


def _import_all() -> tuple[tuple[Patch, ...], dict[str, str]]:
    """Import and check every patch module: (patches ordered, {id: module name})."""
    from patcher.codemod_base import PatchCodemod

    package = importlib.import_module(PACKAGE)
    found: list[Patch] = []
    modules: dict[str, str] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{PACKAGE}.{info.name}")
        patch = getattr(module, "PATCH", None)
        if patch is None:
            continue
        modules[patch.id] = module.__name__
        problems = []
        if not _ID.match(patch.id):
            problems.append(f"id {patch.id!r} is not SPnnn")
        if not (isinstance(patch.codemod, type) and issubclass(patch.codemod, PatchCodemod)):
            problems.append("codemod is not a PatchCodemod subclass")
        if patch.version < 1 or not patch.title or not patch.file.endswith(".py"):
            problems.append("version, title or file missing")
        SpecifierSet(patch.speculators)
        if problems:
            raise RuntimeError(f"{module.__name__}: " + "; ".join(problems))
        found.append(patch)
    known = {p.id for p in found}
    for patch in found:
        if set(patch.requires) - known:
            raise RuntimeError(f"{patch.id} requires unknown patches {sorted(set(patch.requires) - known)}")
    for key in ("id", "name"):
        values = [getattr(p, key) for p in found]
        dupes = {v for v in values if values.count(v) > 1}
        if dupes:
            raise RuntimeError(f"duplicate patch {key}s: {sorted(dupes)}")
    return tuple(sorted(found, key=lambda p: (p.file, p.order, p.id))), modules


def select(only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> tuple[Patch, ...]:
    """Patches chosen by ``--only``/``--skip`` (ids or names). Raises ``UserError`` on unknown ids."""
    patches = all_patches()
    only = tuple(x.upper() if _ID.match(x.upper()) else x for x in only)  # sp004 == SP004
    skip = tuple(x.upper() if _ID.match(x.upper()) else x for x in skip)
    known = {p.id for p in patches} | {p.name for p in patches}
    unknown = [x for x in (*only, *skip) if x not in known]
    if unknown:
        raise UserError(
            f"unknown patch id {', '.join(unknown)} (known: {', '.join(p.id for p in patches)})"
        )
    chosen = [p for p in patches if not only or p.id in only or p.name in only]
    both = [p.id for p in chosen if only and (p.id in skip or p.name in skip)]
    if both:
        raise UserError(f"{', '.join(both)} is both in --only and in --skip: choose one")
    chosen = [p for p in chosen if p.id not in skip and p.name not in skip]
    if not chosen:
        raise UserError("--skip leaves no patch selected")
    ids = {p.id for p in chosen}
    for patch in chosen:
        missing = [r for r in patch.requires if r not in ids]
        if missing:
            raise UserError(f"{patch.id} requires {', '.join(missing)}: select them together")
        dependents = [p.id for p in patches if patch.id in p.requires and p.id not in ids]
        if dependents:
            raise UserError(f"{', '.join(dependents)} require(s) {patch.id}: select them together")
    return tuple(chosen)

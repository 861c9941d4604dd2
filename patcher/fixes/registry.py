"""The patch registry: every ``PATCH`` defined in ``patches/``, validated and ordered,
plus the user patches of this run.

``patches/`` ships as the package ``speculators_patch_codemods`` (see pyproject.toml);
dropping a module there registers it. Once the modules have been imported and checked, their
metadata is kept in the patch index (``patcher.fixes.patch_index``), so later runs that run no
codemod do not import libcst.
User patches join through ``use_patch_files``
(``--patch-file``), installed packs (entry-point group ``speculators_patch.patches``,
loaded on first use) and ``add_recorded`` (user patches a target's manifest names whose
source is not loaded: nameable and droppable, never re-run).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import lru_cache

from packaging.specifiers import SpecifierSet

from patcher import cache
from patcher.digest import tool as tool_digest
from patcher.errors import UserError
from patcher.fixes import patch_index
from patcher.fixes.patch import Patch

PACKAGE = "speculators_patch_codemods"
_ID = re.compile(r"^SP\d{3}$")


@lru_cache(maxsize=1)
def shipped_patches() -> tuple[Patch, ...]:
    """Every patch in ``patches/``, ordered by (file, order). Raises ``RuntimeError`` on bad metadata.

    From the patch index when it holds this exact code (codemods imported on first use),
    else by importing every module (and then the index is written)."""
    digest = tool_digest() if cache.enabled() else None
    indexed = patch_index.load(digest)
    if indexed is not None:
        return indexed
    patches, modules = _import_all()
    patch_index.save(digest, patches, modules)
    return patches


def _import_all() -> tuple[tuple[Patch, ...], dict[str, str]]:
    """Import and check every patch module: (patches ordered, {id: module name})."""
    from patcher.fixes.codemod_base import PatchCodemod

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
        if patch.runner_batch not in ("", "v1", "v2"):
            problems.append(f"runner_batch {patch.runner_batch!r} is not v1 or v2")
        for u in patch.uncovered:
            SpecifierSet(u.speculators)
            if u.symbol not in {f.symbol for f in patch.facts}:
                problems.append(f"uncovered names {u.symbol!r}, not one of its facts")
        if problems:
            raise RuntimeError(f"{module.__name__}: " + "; ".join(problems))
        found.append(patch)
    for key in ("id", "name"):
        values = [getattr(p, key) for p in found]
        dupes = {v for v in values if values.count(v) > 1}
        if dupes:
            raise RuntimeError(f"duplicate patch {key}s: {sorted(dupes)}")
    return tuple(sorted(found, key=lambda p: (p.file, p.order, p.id))), modules


# User patches of this run by id: --patch-file files, then stand-ins for recorded ones.
_user: dict[str, Patch] = {}
_packs: list[Patch] | None = None
_all: tuple[Patch, ...] | None = None


def _packs_loaded() -> list[Patch]:
    global _packs
    if _packs is None:
        from patcher.fixes.userpatches.loader import load_packs

        _packs = _checked(load_packs())  # raises again on every call if it fails
    return _packs


def _checked(new: list[Patch]) -> list[Patch]:
    """``new`` user patches, refused (``UserError``) when an id or name is taken."""
    taken = {p.id: p for p in (*shipped_patches(), *(_packs or []), *_user.values())}
    names = {p.name: p for p in taken.values()}
    for patch in new:
        other = taken.get(patch.id) or names.get(patch.name)
        if other is not None and other.origin != "recorded":
            from patcher.fixes.userpatches.loader import describe

            key = "id" if patch.id in taken else "name"
            raise UserError(
                f"{describe(patch)}: patch {key} {getattr(patch, key)} is already taken by "
                f"{other.id} ({describe(other)})"
            )
        taken[patch.id] = names[patch.name] = patch
    return new


def all_patches() -> tuple[Patch, ...]:
    """Shipped, pack and user patches, ordered by (file, order, id).

    Raises ``UserError`` when an installed pack fails to load.
    """
    global _all
    if _all is None:
        found = (*shipped_patches(), *_packs_loaded(), *_user.values())
        known = {p.id for p in found}
        for patch in found:
            if set(patch.requires) - known:
                raise UserError(
                    f"{patch.id} ({patch.source or patch.origin}) requires unknown patches "
                    f"{', '.join(sorted(set(patch.requires) - known))}"
                )
        _all = tuple(sorted(found, key=lambda p: (p.file, p.order, p.id)))
    return _all


def use_patch_files(paths: tuple[str, ...] | list[str]) -> list[Patch]:
    """Load ``--patch-file`` files into this run's registry. Raises ``UserError`` (one line)
    for an unreadable file, a syntax error, no ``PATCH``, bad metadata or a taken id/name."""
    from patcher.fixes.userpatches.loader import load_file

    global _all
    loaded = []
    for path in paths:
        patch = load_file(path)
        _checked([patch])
        _user[patch.id] = patch
        loaded.append(patch)
    _all = None
    return loaded


def add_recorded(manifest: dict | None) -> None:
    """Stand-ins for the user patches ``manifest`` records (or names in a file's patches
    map) that this run has not loaded (``patcher.fixes.userpatches.record.stand_in``)."""
    from patcher.fixes.userpatches import record

    global _all
    recs = record.records(manifest)
    files = (manifest or {}).get("files") if isinstance(manifest, dict) else None
    known = {p.id for p in all_patches()}
    for path, e in files.items() if isinstance(files, dict) else ():
        for pid, version in (e.get("patches") or {}).items() if isinstance(e, dict) else ():
            if pid not in known and not _ID.match(pid):
                _user[pid] = record.stand_in(pid, recs.get(pid), path, version if isinstance(version, int) else 1)
                known.add(pid)
                _all = None


def user_patches() -> list[Patch]:
    """The loaded (runnable) user patches of this run: packs and ``--patch-file`` files."""
    return [p for p in all_patches() if p.origin in ("file", "package")]


def _canonical(x: str, patches: tuple[Patch, ...]) -> str:
    """``sp004`` and ``fix001`` name SP004 and FIX001; names are kept as given."""
    return x.upper() if x.upper() in {p.id for p in patches} else x


def select(
    only: tuple[str, ...] = (), skip: tuple[str, ...] = (), keep: str | None = None, applied: set[str] | None = None
) -> tuple[Patch, ...]:
    """Patches chosen by ``--only``/``--skip`` (ids or names), in registry order.

    ``keep`` says which ``requires`` links the choice must keep whole: ``"requires"`` (apply,
    diff: a chosen patch needs what it requires chosen too), ``"dependents"`` (revert: dropping a
    patch drops what requires it, of those in ``applied`` when given), ``None`` (status,
    verify: any choice reads fine).
    Raises ``UserError`` (one line, every broken link named) on unknown ids, an id in both
    lists, an empty choice, or a broken link of the kind ``keep`` names.
    """
    patches = all_patches()
    only = tuple(_canonical(x, patches) for x in only)
    skip = tuple(_canonical(x, patches) for x in skip)
    known = {p.id for p in patches} | {p.name for p in patches}
    unknown = [x for x in (*only, *skip) if x not in known]
    if unknown:
        users = [x for x in unknown if re.fullmatch(r"[A-Z]+[0-9]+", x) and not _ID.match(x)]
        why = (
            f": no --patch-file or installed pack defines {', '.join(users)}, and this target's record names "
            f"no such patch (never applied here, or already reverted)"
            if users
            else ""
        )
        raise UserError(
            f"unknown patch id {', '.join(u or repr(u) for u in unknown)}{why} (known: {', '.join(sorted(p.id for p in patches))}; "
            f"or a name from 'speculators-patch list')"
        )
    chosen = [p for p in patches if not only or p.id in only or p.name in only]
    both = [p.id for p in chosen if only and (p.id in skip or p.name in skip)]
    if both:
        raise UserError(f"{', '.join(both)} is both in --only and in --skip: choose one")
    chosen = [p for p in chosen if p.id not in skip and p.name not in skip]
    if not chosen:
        raise UserError("--skip leaves no patch selected")
    ids = {p.id for p in chosen}
    broken = []
    for patch in chosen:
        missing = [r for r in patch.requires if r not in ids]
        if keep == "requires" and missing:
            broken.append(f"{patch.id} requires {', '.join(missing)}")
        dependents = sorted(
            p.id for p in patches if patch.id in p.requires and p.id not in ids and (applied is None or p.id in applied)
        )
        if keep == "dependents" and dependents:
            broken.append(
                f"{', '.join(dependents)} require(s) {patch.id}, so reverting {patch.id} alone would leave them broken"
            )
    if broken:
        raise UserError(f"{'; '.join(broken)}: select them together")
    return tuple(chosen)

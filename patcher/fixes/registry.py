"""The patch registry: every ``PATCH`` defined in ``patches/``, validated and ordered, and
the ``PatchSet`` a run or a target works with.

``patches/`` ships as the package ``speculators_patch_codemods`` (see pyproject.toml);
dropping a module there registers it. Once the modules have been imported and checked, their
metadata is kept in the patch index (``patcher.fixes.patch_index``), so later runs that run no
codemod do not import libcst.

Nothing here changes after it is first read: the shipped patches and the installed packs
(entry-point group ``speculators_patch.patches``) are each read once per process and kept.
A run's patches are a value, ``PatchSet``: ``loaded(patch_files)`` is the shipped patches,
the packs and the ``--patch-file`` files; ``PatchSet.with_recorded(manifest)`` adds stand-ins
for the user patches a target's manifest names whose source is not loaded (nameable and
droppable, never re-run). ``patcher.engine.read_snapshot`` does that for each target, so
one target's record never reaches another's set.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from functools import lru_cache

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from patcher import cache
from patcher.digest import tool as tool_digest
from patcher.errors import UserError
from patcher.fixes import patch_index
from patcher.fixes.manifest import Manifest
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
        if patch.checks.runner_batch not in ("", "v1", "v2"):
            problems.append(f"runner_batch {patch.checks.runner_batch!r} is not v1 or v2")
        for u in patch.checks.uncovered:
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


@lru_cache(maxsize=1)
def installed_packs() -> tuple[Patch, ...]:
    """Every patch of every installed pack, read once (``userpatches.loader.load_packs``).
    Raises ``UserError`` naming the package when a pack fails to load (again on every call)."""
    from patcher.fixes.userpatches.loader import load_packs

    return tuple(load_packs())


def _checked(taken: tuple[Patch, ...], new: tuple[Patch, ...] | list[Patch]) -> tuple[Patch, ...]:
    """``new`` user patches, refused (``UserError``) when an id or name is taken by one of
    ``taken`` or by an earlier one of ``new``."""
    by_id = {p.id: p for p in taken}
    names = {p.name: p for p in taken}
    for patch in new:
        other = by_id.get(patch.id) or names.get(patch.name)
        if other is not None:
            from patcher.fixes.userpatches.loader import describe

            key = "id" if patch.id in by_id else "name"
            raise UserError(
                f"{describe(patch)}: patch {key} {getattr(patch, key)} is already taken by "
                f"{other.id} ({describe(other)})"
            )
        by_id[patch.id] = names[patch.name] = patch
    return tuple(new)


def _ordered(found: tuple[Patch, ...]) -> tuple[Patch, ...]:
    """``found`` ordered by (file, order, id). Raises ``UserError`` when one requires a patch
    not among them."""
    known = {p.id for p in found}
    for patch in found:
        if set(patch.requires) - known:
            raise UserError(
                f"{patch.id} ({patch.source or patch.origin}) requires unknown patches "
                f"{', '.join(sorted(set(patch.requires) - known))}"
            )
    return tuple(sorted(found, key=lambda p: (p.file, p.order, p.id)))


def written_for(version: str | None, patches: tuple[Patch, ...]) -> tuple[Patch, ...]:
    """The patches whose ``speculators`` specifier contains ``version`` (none for an
    unparsable or missing version): each speculators release gets only its own codemods."""
    try:
        parsed = Version(version) if version is not None else None
    except InvalidVersion:
        parsed = None
    return tuple(p for p in patches if parsed is not None and parsed in SpecifierSet(p.speculators))


@dataclass(frozen=True)
class PatchSet:
    """The patches one run works with on one target, ordered by (file, order, id): shipped,
    installed packs, ``--patch-file`` files and stand-ins for recorded user patches.

    Built by ``loaded`` (a run's patches) and ``with_recorded`` (a target's); never changed
    afterwards: every change is a new value.
    """

    patches: tuple[Patch, ...]

    def ids(self) -> frozenset[str]:
        """The id of every patch of the set."""
        return frozenset(p.id for p in self.patches)

    def by_id(self) -> dict[str, Patch]:
        """Every patch of the set by its id (a new dict: changing it changes nothing here)."""
        return {p.id: p for p in self.patches}

    def written_for(self, version: str | None) -> tuple[Patch, ...]:
        """The patches written for speculators ``version`` (``written_for``), in set order."""
        return written_for(version, self.patches)

    def user_patches(self) -> tuple[Patch, ...]:
        """The loaded (runnable) user patches: installed packs and ``--patch-file`` files."""
        return tuple(p for p in self.patches if p.origin in ("file", "package"))

    def with_recorded(self, manifest: Manifest | None) -> PatchSet:
        """This set plus stand-ins for the user patches ``manifest`` records (or names in a
        file's patches map) that it does not hold (``userpatches.record.stand_in``); this set
        itself when there are none."""
        stand_ins = _stand_ins(manifest, set(self.ids()))
        return PatchSet(_ordered((*self.patches, *stand_ins))) if stand_ins else self

    def select(
        self,
        only: tuple[str, ...] = (),
        skip: tuple[str, ...] = (),
        keep: str | None = None,
        applied: set[str] | None = None,
    ) -> tuple[Patch, ...]:
        """Patches chosen by ``--only``/``--skip`` (ids or names), in set order.

        ``keep`` says which ``requires`` links the choice must keep whole: ``"requires"``
        (apply, diff: a chosen patch needs what it requires chosen too), ``"dependents"``
        (revert: dropping a patch drops what requires it, of those in ``applied`` when given),
        ``None`` (status, verify: any choice reads fine).
        Raises ``UserError`` (one line, every broken link named) on unknown ids, an id in both
        lists, an empty choice, or a broken link of the kind ``keep`` names.
        """
        return _select(self.patches, tuple(only), tuple(skip), keep, applied)


def loaded(patch_files: tuple[str, ...] | list[str] = ()) -> PatchSet:
    """A run's patches: the shipped ones, the installed packs and the ``patch_files``
    (``--patch-file``), loaded in the order given.

    Raises ``UserError`` (one line) for an unreadable file, a syntax error, no ``PATCH``, bad
    metadata, an id or name taken twice, a pack that fails to load, or a patch requiring an
    unknown one.
    """
    from patcher.fixes.userpatches.loader import load_file

    shipped = shipped_patches()
    files: tuple[Patch, ...] = ()
    for path in patch_files:
        files += _checked((*shipped, *files), [load_file(str(path))])
    packs = _checked((*shipped, *files), installed_packs())
    return PatchSet(_ordered((*shipped, *packs, *files)))


def _stand_ins(manifest: Manifest | None, known: set[str]) -> list[Patch]:
    """Stand-ins for the user patches ``manifest``'s files name that are not in ``known``."""
    from patcher.fixes.userpatches import record

    if manifest is None:
        return []
    found: list[Patch] = []
    for path, e in manifest.files.items():
        for pid, version in e.patches.items():
            if pid not in known and not _ID.match(pid):
                found.append(record.stand_in(pid, manifest.user_patches.get(pid), path, version))
                known.add(pid)
    return found


def _canonical(x: str, patches: tuple[Patch, ...]) -> str:
    """``sp004`` and ``fix001`` name SP004 and FIX001; names are kept as given."""
    return x.upper() if x.upper() in {p.id for p in patches} else x


def _select(
    patches: tuple[Patch, ...], only: tuple[str, ...], skip: tuple[str, ...], keep: str | None, applied: set[str] | None
) -> tuple[Patch, ...]:
    """``PatchSet.select`` over ``patches`` (its documentation says what each argument means
    and what is refused)."""
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

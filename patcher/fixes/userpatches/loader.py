"""Load user patches: a Python file defining ``PATCH = Patch(...)``, or an installed pack.

A user patch is validated like a shipped one, plus: its id is ``[A-Z]+[0-9]+`` without
the ``SP`` prefix (reserved for shipped patches). Every problem is a ``UserError`` naming
the file (or package) and what is wrong, raised before anything is read from a target.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from patcher.errors import UserError
from patcher.fixes.patch import Patch

GROUP = "speculators_patch.patches"
USER_ID = re.compile(r"[A-Z]+[0-9]+")
RESERVED_PREFIX = "SP"


def problems(patch: object) -> list[str]:
    """What is wrong with a user patch's metadata (empty when nothing is)."""
    if not isinstance(patch, Patch):
        return [f"PATCH is a {type(patch).__name__}, not a patcher.Patch"]
    found = []
    if not isinstance(patch.id, str) or not USER_ID.fullmatch(patch.id):
        found.append(f"id {patch.id!r} is not letters then digits (e.g. FIX001)")
    elif re.fullmatch(rf"{RESERVED_PREFIX}[0-9]+", patch.id):
        found.append(f"id {patch.id} uses the prefix {RESERVED_PREFIX}, reserved for shipped patches (use e.g. FIX001)")
    from patcher.fixes.patch import PatchCodemod  # libcst: only when a user patch is checked

    if not (isinstance(patch.codemod, type) and issubclass(patch.codemod, PatchCodemod)):
        found.append("codemod is not a PatchCodemod subclass")
    if not isinstance(patch.version, int) or patch.version < 1:
        found.append("version must be an integer >= 1")
    if not isinstance(patch.name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", patch.name or ""):
        found.append(f"name {patch.name!r} is not a slug (lower-case letters, digits, '-')")
    if not patch.title:
        found.append("title is empty")
    if not (
        isinstance(patch.file, str)
        and patch.file.startswith("speculators/")
        and patch.file.endswith(".py")
        and ".." not in patch.file.split("/")
    ):
        found.append(f"file {patch.file!r} is not a speculators/....py path")
    try:
        SpecifierSet(patch.speculators)
    except (InvalidSpecifier, TypeError):
        found.append(f"speculators {patch.speculators!r} is not a version specifier (e.g. '==0.3.0')")
    return found


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_file(path: str) -> Patch:
    """The ``PATCH`` a user's patch file defines, with ``origin="file"``.

    Raises ``UserError`` (one line) when the file cannot be read, has a syntax error, raises
    while loading, defines no ``PATCH``, or its metadata is bad.
    """
    file = Path(path).expanduser()
    try:
        resolved = file.resolve(strict=True)
        source = resolved.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read patch file {path}: {e.strerror}") from None
    try:
        code = compile(source, str(resolved), "exec", dont_inherit=True)
    except SyntaxError as e:
        where = f"{path}:{e.lineno}" if e.lineno else str(path)  # a NUL byte has no line
        raise UserError(f"patch file {where}: syntax error: {e.msg}") from None
    except ValueError as e:  # NUL bytes
        raise UserError(f"patch file {path} is not Python source: {e}") from None
    digest = hashlib.sha256(source).hexdigest()
    module = ModuleType(f"speculators_patch_user_{digest[:16]}")
    module.__file__ = str(resolved)
    sys.modules[module.__name__] = module  # dataclasses and pickling look modules up by name
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as e:  # the user's code: any exception (or exit) is bad input
        sys.modules.pop(module.__name__, None)
        raise UserError(f"patch file {path}: loading it raised {type(e).__name__}: {e}") from None
    if "PATCH" not in module.__dict__:
        raise UserError(f"patch file {path} defines no PATCH (expected PATCH = Patch(...), as in the shipped patches)")
    patch = module.PATCH
    bad = problems(patch)
    if bad:
        raise UserError(f"patch file {path}: " + "; ".join(bad))
    return dataclasses.replace(patch, origin="file", source=str(resolved), source_sha256=digest)


def _from_entry_point(ep: metadata.EntryPoint) -> list[Patch]:
    """Patches an entry point names: a module defining ``PATCH`` (or ``PATCHES``), a
    ``Patch``, or a sequence of them."""
    where = f"package {ep.dist.name if ep.dist else '?'} (entry point {ep.name} = {ep.value})"
    try:
        loaded = ep.load()
    except (Exception, SystemExit) as e:
        raise UserError(f"{where}: loading it raised {type(e).__name__}: {e}") from None
    if isinstance(loaded, ModuleType):
        found = getattr(loaded, "PATCHES", None) or ([loaded.PATCH] if hasattr(loaded, "PATCH") else None)
        if found is None:
            raise UserError(f"{where}: module {loaded.__name__} defines no PATCH (or PATCHES)")
    elif isinstance(loaded, (list, tuple)):
        found = list(loaded)
    else:
        found = [loaded]
    patches = []
    for patch in found:
        bad = problems(patch)
        if bad:
            raise UserError(f"{where}: " + "; ".join(bad))
        module = sys.modules.get(patch.codemod.__module__)
        file = Path(getattr(module, "__file__", "") or "")
        digest = _sha256(file) if file.is_file() else ""
        version = ep.dist.version if ep.dist else "?"
        patches.append(
            dataclasses.replace(
                patch, origin="package", source=f"{ep.dist.name if ep.dist else '?'} {version}", source_sha256=digest
            )
        )
    return patches


def load_packs() -> list[Patch]:
    """Every patch of every installed pack (entry-point group ``speculators_patch.patches``).

    Raises ``UserError`` naming the package when a pack fails to load or its metadata is bad.
    """
    found: list[Patch] = []
    for ep in sorted(metadata.entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
        found += _from_entry_point(ep)
    return found


def origin_fields(patch: Patch) -> dict:
    """For JSON: ``origin`` (``shipped``, ``file`` or ``package``), ``source`` (the file's path
    or ``<distribution> <version>``; None for shipped) and ``loaded`` (False: a recorded user
    patch whose source this run has not loaded)."""
    if patch.origin == "recorded":
        kind, _, source = patch.source.partition(" ")
        return {"origin": kind, "source": source, "loaded": False}
    return {"origin": patch.origin, "source": patch.source or None, "loaded": True}


def describe(patch: Patch) -> str:
    """Where a patch comes from, for tables: ``shipped``, ``file /p/fix001.py``,
    ``package fixpack 1.0``, ``recorded (...)``."""
    if patch.origin == "shipped":
        return "shipped"
    if patch.origin == "recorded":
        return f"{patch.source} (recorded; source not loaded)"
    return f"{patch.origin} {patch.source}"

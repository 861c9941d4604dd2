"""The patch list as data, so reading it does not import the codemods (and libcst with them).

Every patch module defines a libcst codemod class, so importing ``patches/`` imports libcst
(0.3-0.5 s, most of it ``libcst.matchers``). ``status``, ``verify`` and a no-op ``apply``
need only the patches' metadata and their vLLM probes. The first run imports the modules
as ever and stores that metadata in the cache (``patcher.cache``), keyed by the tool's digest
(``patcher.digest``: every file of the tool and its codemods, and libcst's version). Later runs rebuild ``Patch`` objects from it; each one's
``codemod`` is a ``LazyCodemod`` that imports its module on first use. Any edit to a patch
changes the key, so a stale index is never read.
"""

from __future__ import annotations

import importlib

from patcher import cache
from patcher.fixes import probes
from patcher.fixes.patch import CheckHooks, Patch, Uncovered, VllmFact

KIND = "patch-index"


class LazyCodemod:
    """Stands for a patch's codemod class until it is used: calling it or reading any of its
    attributes (``__module__``, ``__name__``, ``__qualname__`` and ``__doc__`` included)
    imports the patch module (and libcst) and answers with the real class."""

    FORWARDED = frozenset({"__module__", "__name__", "__qualname__", "__doc__"})

    def __init__(self, module: str) -> None:
        self.module = module

    def __getattribute__(self, name: str):
        if name in LazyCodemod.FORWARDED:
            return getattr(object.__getattribute__(self, "resolve")(), name)
        return object.__getattribute__(self, name)

    def resolve(self) -> type:
        """The real codemod class (imports the patch module, and libcst, on first use)."""
        return importlib.import_module(self.module).PATCH.codemod

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy/pickle protocol lookups: not the class's
            raise AttributeError(name)
        return getattr(self.resolve(), name)


def dump(patches: tuple[Patch, ...], modules: dict[str, str]) -> list[dict] | None:
    """The metadata of ``patches`` as JSON-able data; ``modules`` maps a patch id to the module
    defining its ``PATCH``. None when a probe cannot be rebuilt from data (no ``recipe``)."""
    rows = []
    for p in patches:
        facts = []
        for f in p.facts:
            recipe = getattr(f.probe, "recipe", None)
            if recipe is None:
                return None
            facts.append(
                {
                    "summary": f.summary,
                    "symbol": f.symbol,
                    "first_release": f.first_release,
                    "probe": recipe,
                    "of_serving": f.of_serving,
                }
            )
        rows.append(
            {
                "id": p.id,
                "name": p.name,
                "version": p.version,
                "title": p.title,
                "file": p.file,
                "module": modules[p.id],
                "facts": facts,
                "speculators": p.speculators,
                "order": p.order,
                "portable": p.portable,
                "requires": list(p.requires),
                "depends_on": p.depends_on,
                "risk": p.risk,
                "checks": {
                    "engine_steps": list(p.checks.engine_steps),
                    "runner_batch": p.checks.runner_batch,
                    "symptoms": list(p.checks.symptoms),
                    "attribution": p.checks.attribution,
                    "uncovered": [[u.speculators, u.symbol, u.what] for u in p.checks.uncovered],
                },
            }
        )
    return rows


def build(rows: list[dict]) -> tuple[Patch, ...]:
    """``Patch`` objects from ``dump``'s rows (codemods lazy). Raises KeyError, TypeError or
    AttributeError on rows of another shape."""
    patches = []
    for r in rows:
        facts = tuple(
            VllmFact(
                f["summary"],
                f["symbol"],
                f["first_release"],
                getattr(probes, f["probe"][0])(*f["probe"][1], **f["probe"][2]),
                of_serving=f["of_serving"],
            )
            for f in r["facts"]
        )
        patches.append(
            Patch(
                r["id"],
                r["name"],
                r["version"],
                r["title"],
                r["file"],
                LazyCodemod(r["module"]),
                facts,
                r["speculators"],
                r["order"],
                r["portable"],
                tuple(r["requires"]),
                depends_on=r["depends_on"],
                risk=r["risk"],
                checks=CheckHooks(
                    engine_steps=tuple(r["checks"]["engine_steps"]),
                    runner_batch=r["checks"]["runner_batch"],
                    symptoms=tuple(r["checks"]["symptoms"]),
                    attribution=r["checks"]["attribution"],
                    uncovered=tuple(Uncovered(*u) for u in r["checks"]["uncovered"]),
                ),
            )
        )
    return tuple(patches)


def load(digest: str | None) -> tuple[Patch, ...] | None:
    """The patches stored for ``digest``, or None (not stored, damaged, or fast paths off)."""
    if digest is None:
        return None
    rows = cache.load(KIND, digest)
    if not isinstance(rows, list):
        return None
    try:
        return build(rows)
    except (KeyError, TypeError, AttributeError, IndexError):
        return None


def save(digest: str | None, patches: tuple[Patch, ...], modules: dict[str, str]) -> None:
    """Store ``patches`` under ``digest`` (nothing when either cannot be stored)."""
    rows = dump(patches, modules)
    if digest is not None and rows is not None:
        cache.store(KIND, digest, rows)

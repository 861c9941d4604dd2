"""``list``, as data: every patch this run knows (shipped, installed packs, ``--patch-file``)
with the vLLM facts it depends on, and the summary both front ends print. It reads no target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from patcher.fixes.registry import PatchSet


@dataclass
class Listed:
    """Every patch as a row (the data of ``list --json``), where each user patch comes from
    (``origins``: id -> ``describe``; empty when every patch is shipped) and the one-line
    ``summary``."""

    rows: list[dict]
    origins: dict[str, str]
    summary: str
    supported: str = ""  # the support statement (``fixes.support.sentence``)

    @property
    def exit_code(self) -> int:
        """Always 0: listing reads no target, and what it cannot load is refused before."""
        return 0

    @property
    def outcome(self) -> tuple[str, str]:
        """(outcome, reason) as a run over several hosts would say it: ``ok`` (``list`` reads
        no host, so it never runs on several)."""
        return "ok", ""


def listing(patch_set: PatchSet) -> Listed:
    """Every patch of ``patch_set`` (the run's: ``registry.loaded``), by id. Raises nothing."""
    from patcher.fixes.support import releases_for, sentence
    from patcher.fixes.userpatches.loader import describe, origin_fields

    patches = sorted(patch_set.patches, key=lambda p: p.id)
    rows = [
        {
            "id": p.id,
            "name": p.name,
            "version": p.version,
            "file": p.file,
            "title": p.title,
            "speculators": releases_for([p.speculators]),
            **origin_fields(p),
            "facts": [
                {"symbol": f.symbol, "modules": list(f.modules), "summary": f.summary, "first_release": f.first_release}
                for f in p.facts
            ],
            "depends_on": p.depends_on,
            "requires": list(p.requires),
        }
        for p in patches
    ]
    origins = {p.id: describe(p) for p in patches if p.origin != "shipped"}
    shipped = len(patches) - len(origins)
    return Listed(
        rows,
        origins,
        f"{len(patches)} patch(es): {shipped} shipped" + (f", {len(origins)} of your own" if origins else ""),
        f"supported: {sentence()}",
    )


def depends_on(row: dict) -> str:
    """What a ``list`` row's patch depends on, in one cell: each vLLM fact with its modules
    and first release, else the dependency in words, else speculators' own logic."""
    facts = "; ".join(f"{f['symbol']} ({', '.join(f['modules'])}, >= {f['first_release']})" for f in row["facts"])
    return facts or row["depends_on"] or "speculators' own logic"

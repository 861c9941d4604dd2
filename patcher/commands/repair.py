"""``repair``, as data: a consistent record rebuilt from the files and the verified pristine
copies (``patcher.engine.repair``), one line per file, and the summary both front ends print."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from patcher.commands.common import describe, notes

if TYPE_CHECKING:
    from patcher.connect.transport import Transport
    from patcher.engine import RepairResult
    from patcher.fixes.registry import PatchSet


@dataclass
class Repaired:
    """What ``repair`` did: the engine's ``result``, what the state had wrong before it
    (``was``, None when nothing), one line per file (``lines``), the notes on the install,
    the one-line ``summary`` and the data of ``repair --json``."""

    result: RepairResult
    was: str | None
    lines: list[str]
    notes: list[str]
    summary: str
    data: dict

    @property
    def changed(self) -> bool:
        """Whether the record was rebuilt (it was damaged, lost, or of another release)."""
        return bool(self.was or self.result.dropped)

    @property
    def exit_code(self) -> int:
        """1 when a file differs from what pip installed and nothing kept restores it, else 0."""
        return 1 if self.result.unrestorable else 0

    @property
    def outcome(self) -> tuple[str, str]:
        """This host's (outcome, reason) in a run over several hosts: ``unrestorable`` with the
        number of files nothing kept restores (repair ran: that is its finding, not a
        failure), else ``repaired`` when the state had something wrong, else ``ok``."""
        unrestorable = self.result.unrestorable
        if unrestorable:
            return (
                "unrestorable",
                f"{len(unrestorable)} file(s) differ from what pip installed; nothing kept restores them",
            )
        return ("repaired", "") if self.was else ("ok", "")


def summary(result: RepairResult) -> str:
    """The line ``repair`` ends with."""
    if result.unrestorable:
        return (
            f"repair: {len(result.unrestorable)} file(s) differ from what pip installed and nothing kept here "
            f"restores them (listed above); the record covers the rest"
        )
    if result.snap.state_problem or result.dropped:
        return "repaired: the record matches the files"
    if not result.snap.recorded_paths():
        return "nothing to repair: no record, and every file is as pip installed it; checked again"
    return "nothing to repair: the record already matched the files; checked again"


def repair(transport: Transport, patches: PatchSet | None = None) -> Repaired:
    """``repair`` on the target behind ``transport`` (already entered) with this run's
    ``patches`` (None: shipped and installed packs): it reads the target itself, before and
    after the agent's repair. Returns a ``Repaired``. Raises ``UserError`` as ``engine.repair``."""
    from patcher import engine

    result = engine.repair(transport, patches)
    snap = result.snap
    said = notes(result.after or snap)
    line = summary(result)
    data = {
        **describe(snap),
        "was": snap.state_problem,
        "files": result.lines,
        "unrestorable": result.unrestorable,
        "summary": line,
    }
    return Repaired(result, snap.state_problem, result.lines, said, line, data)

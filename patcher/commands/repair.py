"""``repair``, as data: a consistent record rebuilt from the files and the verified pristine
copies (``patcher.engine.repair``), one line per file, and the summary both front ends print."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from patcher.commands.common import describe, notes
from patcher.errors import UserError

if TYPE_CHECKING:
    from patcher.connect.transport import Transport
    from patcher.engine import RepairResult
    from patcher.fixes.registry import PatchSet


@dataclass
class Repaired:
    """What ``repair`` did: the engine's ``result``, what the state had wrong before it
    (``was``, None when nothing), one line per file (``lines``), the notes on the install,
    the one-line ``summary`` and the data of ``repair --json``."""

    result: RepairResult | None  # None: speculators is gone, and the state it left was removed (``removed``)
    was: str | None
    lines: list[str]
    notes: list[str]
    summary: str
    data: dict
    removed: str | None = None  # the state directory removed: speculators was uninstalled since

    @property
    def changed(self) -> bool:
        """Whether the record was rebuilt (it was damaged, lost, of another release, or no
        longer described the files) or the state removed."""
        if self.result is None:
            return bool(self.removed)
        return bool(self.was or self.result.dropped or self.result.rewritten)

    @property
    def exit_code(self) -> int:
        """1 when a file differs from what pip installed and nothing kept restores it, else 0."""
        return 1 if self.result is not None and self.result.unrestorable else 0

    @property
    def outcome(self) -> tuple[str, str]:
        """This host's (outcome, reason) in a run over several hosts: ``unrestorable`` with the
        number of files nothing kept restores (repair ran: that is its finding, not a
        failure), else ``repaired`` when the state had something wrong, else ``ok``."""
        unrestorable = self.result.unrestorable if self.result is not None else []
        if unrestorable:
            return (
                "unrestorable",
                f"{len(unrestorable)} file(s) differ from what pip installed; nothing kept restores them",
            )
        return ("repaired", "") if self.changed else ("ok", "")


def summary(result: RepairResult) -> str:
    """The line ``repair`` ends with."""
    if result.unrestorable:
        return (
            f"repair: {len(result.unrestorable)} file(s) differ from what pip installed and nothing kept here "
            f"restores them (listed above); the record covers the rest"
        )
    if result.rewritten:  # the record was changed: never "nothing to repair"
        return f"repaired: {'; '.join(result.rewritten)}; the record matches the files"
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

    try:
        result = engine.repair(transport, patches)
    except UserError as e:
        if not is_orphaned(str(e)):
            raise
        return _forget(transport, str(e))
    snap = result.snap
    said = notes(result.after or snap, installer=False)
    line = summary(result)
    data = {
        **describe(snap),
        "was": snap.state_problem,
        "files": result.lines,
        "unrestorable": result.unrestorable,
        "summary": line,
    }
    return Repaired(result, snap.state_problem, result.lines, said, line, data)


# How the agent's "no speculators installed" ends when it found this tool's state there
# (``agent.state.orphaned_state``).
ORPHANED = "and speculators was uninstalled since"


def is_orphaned(message: str) -> bool:
    """Whether a refusal says speculators is gone and this tool's state is left over."""
    return message.startswith("no speculators installed") and ORPHANED in message


def _forget(transport: Transport, why: str) -> Repaired:
    """``repair`` where speculators was uninstalled: the agent removes the state it left
    (``why``: the agent's words that found it). Returns a ``Repaired`` with no result."""
    removed = transport.request("forget")["removed"]
    line = (
        f"repaired: removed {removed}: speculators was uninstalled since it was patched, and nothing there is needed"
        if removed
        else "nothing to repair: speculators is installed again, or its state was removed meanwhile; checked again"
    )
    data = {"target": transport.label, "was": why, "files": [], "unrestorable": [], "removed": removed, "summary": line}
    return Repaired(None, why, [], [], line, data, removed)

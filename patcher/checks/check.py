"""What every check of ``verify`` implements (``Check``), what it judges (``Found``) and what
they add up to (``InstallCheck``); ``patcher.checks.checklist`` lists them.

A check asks the target (``ask``: fields of verify's one ``sources`` request), judges what came
back (``judge``: its part of an ``InstallCheck``), says whether its part passes (``ok``), gives
its entries of ``verify --json`` (``as_json``) and prints its lines (``render``, and under
``apply``'s table when apply's check fails, ``render_failed``). ``commands.verify`` loops over
``checklist.checks()``; a new kind of check is one module with a ``CHECK`` and one line there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from patcher.engine import Snapshot


@dataclass(frozen=True)
class Found:
    """What the checks judge: the snapshot (after the commit, for ``apply``), the patches whose
    verdicts count (``ids``, narrowed by ``--only``/``--skip``), every patch's verdict
    (``checks.verify.verdicts``) and what the ``sources`` exchange found (``calls``). A fix
    hint in them names its way out as a ``patcher.ways.Way`` token, which the front end words."""

    snap: Snapshot
    ids: set[str]
    facts: list  # checks.verify.FactCheck
    every: list  # checks.verify.PatchCheck
    calls: Any  # checks.verify.CallsCheck

    @property
    def present(self) -> set[str]:
        """The patches in the installed code (applied, or already satisfied)."""
        return {c.patch.id for c in self.every if c.state in ("applied", "satisfied")}


class Check:
    """One check of ``verify``. ``key``: its part's name (``InstallCheck.parts``); ``failing``:
    its words in ``verify: FAILED (...)``. The defaults ask nothing and print nothing."""

    key = ""
    failing = ""
    reads: tuple[str, ...] = ()  # vLLM files it reads afresh each run, kept with the calls cache's entry

    def ask(self, snap: Snapshot) -> dict:
        """Fields this check adds to verify's ``sources`` request (lists are joined)."""
        return {}

    def judge(self, found: Found) -> Any:
        """This check's part: what it found, or None where it has nothing to check here."""
        raise NotImplementedError

    def ok(self, part: Any) -> bool:
        """True when ``part`` passes (None, nothing checked, passes)."""
        return part is None or part.ok

    def as_json(self, part: Any, snap: Snapshot) -> dict:
        """Its entries of ``verify --json``."""
        return {self.key: part.as_dict() if part is not None else None}

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        """Its lines in ``verify``'s report (``install.parts[key]``: its part). A way out is a
        ``patcher.ways.Way`` in the text: the front end's console words it for this run."""

    def render_failed(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        """Its lines under ``apply``'s table when apply's check of what it wrote fails."""


# verify's exit code when every static check passes but the installed vLLM's release has no
# engine proof (patcher/checks/proven.py): a script can tell "not proven" (3) from "broken" (1).
UNPROVEN = 3
NO_PROOF = "no engine proof for this vLLM"
# The verdict's words where no vLLM is installed (``Snapshot.not_checked`` says which patches).
TRAINING_HALF_ONLY = "the training half only: no vLLM installed, data generation not checked"


@dataclass
class InstallCheck:
    """What ``verify`` checks, for one target: the library facts and the patch verdicts (rows,
    narrowed by ``--only``/``--skip``), the call check, the engine proof (``unproven``: why
    there is none; ``devices``: where the release was proven), user patches whose source
    changed, files modified after patching, and every check's part by its key (``parts``).
    ``failing`` names each failed part in words; ``ok`` when none failed."""

    facts: list
    rows: list[dict]
    calls: Any  # checks.verify.CallsCheck
    unproven: str | None
    changed_sources: list[dict]
    modified: list[str]
    failing: list[str]
    devices: list[str] = field(default_factory=list)
    parts: dict[str, Any] = field(default_factory=dict)
    all_rows: list[dict] = field(default_factory=list)  # the verdict of every patch, counted or not
    not_checked: str | None = None  # what could not be checked here (``Snapshot.not_checked``)

    @property
    def ok(self) -> bool:
        """True when no part failed (``verify``'s exit 0)."""
        return not self.failing

    @property
    def only_unproven(self) -> bool:
        """Every static check passes; only the engine proof is missing."""
        return self.failing == [NO_PROOF]

    @property
    def exit_code(self) -> int:
        """0 OK, ``UNPROVEN`` (3) when only the engine proof is missing, else 1."""
        return 0 if self.ok else UNPROVEN if self.only_unproven else 1

    @property
    def verdict(self) -> tuple[str, str]:
        """The one-line verdict ``verify`` ends with (``apply`` too, when it is not OK), as
        (the verdict, what follows it): ``verify: OK``, ``verify: NOT PROVEN`` with what
        is missing, or ``verify: FAILED`` with the parts that failed."""
        if self.ok and self.not_checked:  # never an OK for the half it could not see
            return "verify: OK", f" ({TRAINING_HALF_ONLY})"
        if self.ok:
            return "verify: OK", ""
        if self.only_unproven:  # what is missing and how to get it
            return "verify: NOT PROVEN", f" (every static check passes): {self.unproven}"
        unseen = f"; {TRAINING_HALF_ONLY}" if self.not_checked else ""
        return "verify: FAILED", f" ({', '.join(self.failing)}){unseen}"

    @property
    def summary(self) -> str:
        """``verdict`` as one line of text."""
        return "".join(self.verdict)

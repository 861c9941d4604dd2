"""What a front end asks of a verb, one value per verb: the command line builds it from its
options (``patcher.cli.run``), the Ansible action plugins from a task's arguments, and both run
it alike, ``request.run(work, snap)``: the patches ``only``/``skip`` choose for the verb
(``common.chosen``), then the verb's function with the request's flags. A flag one front end
has no word for keeps its default there (Ansible's check mode is ``dry_run``).
"""

from __future__ import annotations

from dataclasses import dataclass

from patcher.commands.apply import Applied, apply
from patcher.commands.common import chosen
from patcher.commands.diff import Diffed, diff
from patcher.commands.revert import Reverted, revert
from patcher.commands.status import Status, status
from patcher.commands.verify import Verified, verify
from patcher.connect.session import Session
from patcher.engine import Snapshot


@dataclass(frozen=True)
class Choice:
    """``--only``/``--skip``: patch ids or names (``Patch.id``, ``Patch.name``); empty: all."""

    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()

    def chosen(self, snap: Snapshot, verb: str):
        """The patches of ``snap`` chosen for ``verb``. Raises ``UserError`` for an unknown id."""
        return chosen(snap, verb, self.only, self.skip)


@dataclass(frozen=True)
class ApplyRequest(Choice):
    """``apply``: ``dry_run`` writes nothing; ``adopt`` keeps a hand edit; ``allow_partial``
    counts only the chosen patches' verdicts; ``verify_after`` False leaves out the checks on
    the result (Ansible's ``speculators_patch_info`` task makes them)."""

    dry_run: bool = False
    adopt: bool = False
    allow_partial: bool = False
    verify_after: bool = True

    def run(self, work: Session, snap: Snapshot) -> Applied:
        return apply(
            work,
            snap,
            self.chosen(snap, "apply"),
            self.dry_run,
            self.adopt,
            verify_after=self.verify_after,
            allow_partial=self.allow_partial,
        )


@dataclass(frozen=True)
class RevertRequest(Choice):
    """``revert``: every patch, or with ``only``/``skip`` the chosen ones (and what depends on
    them); ``force`` restores over a hand edit; ``dry_run`` writes nothing."""

    force: bool = False
    dry_run: bool = False

    def run(self, work: Session, snap: Snapshot) -> Reverted:
        partial = bool(self.only or self.skip)
        return revert(work, snap, self.chosen(snap, "revert"), partial, self.force, self.dry_run)


@dataclass(frozen=True)
class StatusRequest(Choice):
    """``status``."""

    def run(self, work: Session, snap: Snapshot) -> Status:
        return status(snap, self.chosen(snap, "status"), work)


@dataclass(frozen=True)
class VerifyRequest(Choice):
    """``verify``; ``runtime`` also imports vLLM on the target (``verify --runtime``)."""

    runtime: bool = False

    def run(self, work: Session, snap: Snapshot) -> Verified:
        return verify(work, snap, self.chosen(snap, "verify"), self.runtime)


@dataclass(frozen=True)
class DiffRequest(Choice):
    """``diff``."""

    def run(self, work: Session, snap: Snapshot) -> Diffed:
        return diff(work, snap, self.chosen(snap, "diff"))

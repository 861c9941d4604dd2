"""One verb on one target: the first snapshot, the verb, and the retry when another writer
got there first. The command line and the Ansible collection run every verb through
``run``, so both read, retry and refuse alike."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Callable, TypeVar

from patcher.errors import UserError

if TYPE_CHECKING:
    from patcher.connect.session import Session
    from patcher.connect.transport import Transport
    from patcher.engine import Snapshot
    from patcher.fixes.registry import PatchSet

T = TypeVar("T")

# Tries in all when a file changed between the read and the commit (``changed-since-read``).
TRIES = 5


def run(
    transport: Transport | Session, verb: Callable[[Snapshot], T], retry: bool = True, patches: PatchSet | None = None
) -> tuple[Snapshot, T]:
    """``verb(snapshot)`` on the target behind ``transport`` (already entered; or this run's
    ``connect.session.Session``, whose queued requests then ride on the reads), each snapshot
    read with this run's ``patches`` (None: shipped and installed packs); again on a
    fresh snapshot, up to ``TRIES`` times in all, when a file changed between the read and
    the commit (another node applied meanwhile: each retry follows another writer's
    success). Returns the snapshot the answer was made on, and the answer. Raises
    ``UserError`` as the verb or the read does."""
    from patcher import engine

    snap = first_snapshot(transport, patches)
    for tries in range(1, TRIES + 1):
        try:
            return snap, verb(snap)
        except UserError as e:
            if not (retry and tries < TRIES and str(e).startswith("changed-since-read")):
                raise
            snap = engine.read_snapshot(transport, patches)
            snap.raced = True  # its answer says what this run found after the other's commit
    raise AssertionError("unreachable")


def first_snapshot(transport: Transport | Session, patches: PatchSet | None = None) -> Snapshot:
    """``engine.read_snapshot`` with ``patches``; where no target was named and none is active, a missing
    speculators is said to be missing from the tool's own environment, with the way out."""
    from patcher import engine

    try:
        return engine.read_snapshot(transport, patches)
    except UserError as e:
        if getattr(getattr(transport, "transport", transport), "tool_env", False) and str(e).startswith(
            "no speculators installed"
        ):
            prefix = os.path.dirname(os.path.dirname(sys.executable))
            raise UserError(
                f"no speculators installed in {prefix}, the environment speculators-patch itself runs in "
                f"(no --target given, and neither $VIRTUAL_ENV nor $CONDA_PREFIX is set); pass "
                f"--target PATH: the venv or conda prefix, site-packages directory or Python interpreter "
                f"of the environment that has speculators"
            ) from None
        raise

"""The engine: read a target, plan the rewrite, commit it, revert it, repair it.

It knows nothing about any particular patch: it runs each ``Patch``'s codemod in order on
each file's current source, and leaves reading and writing to the agent over a transport
(two exchanges for ``apply``: one ``inspect``, one ``commit``). Top down: ``repair`` and
``commit`` (apply, revert) use ``plan`` (every file), which takes each file's outcomes from
``fast_path`` (the manifest's record), ``plan_cache`` or ``file_plan`` (the codemods run);
all of them read a ``snapshot``.
"""

from patcher.engine.commit import CommitResult, after, apply, revert
from patcher.engine.file_plan import (
    NOT_NEEDED,
    FilePlan,
    Outcome,
    fact_missing,
    need_state,
    needed,
    parse,
    plan_file,
    run_codemod,
    transform,
)
from patcher.engine.plan import guard_modified, plan, refusals
from patcher.engine.repair import RepairResult, repair
from patcher.engine.snapshot import (
    Snapshot,
    check_covered,
    check_supported,
    read_snapshot,
    sha256,
    written_for,
)
from patcher.fixes.patch import Uncovered

__all__ = [
    "NOT_NEEDED",
    "CommitResult",
    "FilePlan",
    "Outcome",
    "RepairResult",
    "Snapshot",
    "Uncovered",
    "after",
    "apply",
    "check_covered",
    "check_supported",
    "fact_missing",
    "guard_modified",
    "need_state",
    "needed",
    "parse",
    "plan",
    "plan_file",
    "read_snapshot",
    "refusals",
    "repair",
    "revert",
    "run_codemod",
    "sha256",
    "transform",
    "written_for",
]

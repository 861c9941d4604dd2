"""``diff``, as data: what ``apply`` would write, as one unified diff, refusing what ``apply``
would refuse."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from patcher.commands.common import (
    describe,
    outcome_rows,
    refuse_before_planning,
    refuse_lost_state,
    unsupported_reason,
)
from patcher.commands.status import stale_reason
from patcher.errors import UserError
from patcher.states import FileState
from patcher.ways import Way

if TYPE_CHECKING:
    from patcher.connect.transport import Transport
    from patcher.engine import FilePlan, Snapshot


@dataclass
class Diffed:
    """What ``apply`` would write: the plans, their unified diff, the data of ``diff --json``,
    and (``summary``) why there is no diff when files changed after patching keep it empty."""

    plans: list[FilePlan]
    text: str
    data: dict
    summary: str | None = None

    @property
    def exit_code(self) -> int:
        """2 when the target is unsupported (``apply`` would write nothing: ``status``'s exit);
        1 when there is a diff, or files changed after patching or patches applied for another
        vLLM release (stale) keep it empty; else 0."""
        if self.data.get("unsupported"):
            return 2
        return 1 if self.text or self.data["modified_files"] or self.data["stale"] else 0

    @property
    def outcome(self) -> tuple[str, str]:
        """This host's (outcome, reason) in a run over several hosts: ``would-change`` when
        there is a diff (the diff itself is in ``--json``), ``unsupported`` with ``status``'s
        reason, else ``unchanged``."""
        if self.data.get("unsupported"):
            return "unsupported", self.data["unsupported"]
        return ("would-change", "diff printed in --json") if self.data["changed"] else ("unchanged", "")


def diff(transport: Transport, snap: Snapshot, chosen) -> Diffed:
    """``diff``: the plans of ``chosen`` on ``snap`` and their unified diff, as a ``Diffed``.
    Raises ``UserError`` for what ``apply`` would refuse: an unsupported target, a vLLM change
    no patch covers, a user patch edited since it was applied, a codemod's refusal, lost
    state, a file modified after patching that the patches would change."""
    from patcher import engine

    refuse_before_planning(snap, chosen, "diff")
    plans = engine.plan(snap, chosen)
    refused = engine.refusals(plans)
    if refused:
        raise UserError(refused[0])
    refuse_lost_state(snap, "apply", plans)  # as apply would refuse
    engine.guard_modified(snap, [p.path for p in plans if p.changed])  # as apply would refuse
    unsupported = unsupported_reason(outcome_rows(plans))
    text = "" if unsupported else unified_diff(plans)  # apply would write nothing there
    modified = sorted(p.path for p in plans if snap.file_state(p.path) == FileState.MODIFIED)
    from patcher.checks.verify import recorded_states

    stale = sorted(pid for pid, state in recorded_states(snap, plans).items() if state == "stale")
    said = None
    if unsupported:
        said = f"install is unsupported ({unsupported}): apply would write nothing; nothing was changed"
    elif modified and not text:  # apply leaves such a file as it is and fails verify's check
        one = len(modified) == 1
        said = (
            f"no diff: {', '.join(modified)} changed after patching, so apply leaves {'it' if one else 'them'} "
            f"as {'it is' if one else 'they are'} and ends with verify: FAILED (a file modified after patching); "
            f"`{Way('apply', ('--adopt',))}` keeps the edit, "
            f"`{Way('revert', ('--force',))}` restores the kept copy (the edit is lost)"
        )
    elif stale and not text:  # apply writes nothing either: the install is wrong for this vLLM as it stands
        said = f"no diff: {stale_reason(stale, snap.vllm_version or 'none')}"
    data = {
        **describe(snap),
        "changed": bool(text),
        "diff": text,
        "patches": outcome_rows(plans),
        "modified_files": modified,
        "stale": stale,
        "summary": said,
        "unsupported": unsupported or None,
    }
    if unsupported:  # exit 2 is a refusal: one error line, in --json an "error" (as apply's)
        data["error"] = said
    return Diffed(plans, text, data, said)


def _text(source: bytes) -> str:
    """Source bytes as text, in the encoding its coding cookie declares (PEP 263)."""
    import io
    import tokenize

    try:
        encoding = tokenize.detect_encoding(io.BytesIO(source).readline)[0]
        return source.decode(encoding)
    except (SyntaxError, LookupError, UnicodeError):
        return source.decode("utf-8", "replace")


def unified_diff(plans: list[FilePlan]) -> str:
    """The changed files of ``plans`` as one unified diff (``a/PATH``, ``b/PATH``); an empty
    string when none changed. Raises nothing (undecodable bytes are replaced)."""
    chunks = []
    for p in plans:
        if p.changed:
            chunks += difflib.unified_diff(
                _text(p.before).splitlines(True),
                _text(p.after).splitlines(True),
                f"a/{p.path}",
                f"b/{p.path}",
            )
    return "".join(chunks)

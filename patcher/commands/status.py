"""``status``, as data: each file's state, each patch's, and the install's in one word."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from patcher.checks.parts import mark_edited, mark_other_versions
from patcher.commands.common import describe, outcome_rows, refuse_lost_state, source_changes, unsupported_reason
from patcher.commands.verify import TRAINING_HALF_ONLY
from patcher.states import FileState, InstallState
from patcher.ways import Way

if TYPE_CHECKING:
    from patcher.engine import FilePlan, Snapshot


@dataclass
class Status:
    """Each file's state and each patch's row (``stale``: applied by us for another vLLM;
    ``source-changed``: a user patch whose file changed since it was applied; ``other-version``:
    applied at another version of this tool's patch)."""

    plans: list[FilePlan]
    rows: list[dict]
    files: dict[str, str]
    data: dict

    @property
    def summary(self) -> str:
        """The install's state in one line: ``install is STATE (reason)``."""
        install = self.data["install"]
        return f"install is {install['state']}" + (f" ({install['reason']})" if install["reason"] else "")

    @property
    def exit_code(self) -> int:
        """``status`` as a gate, the same on one target and in each host's row of many: 0 when
        the install is ``patched``, 2 when it is ``unsupported`` (no patch here handles it, as
        a refused target), else 1 (pristine, partial, stale, modified, broken: its static checks
        fail, reinstalled: an installer replaced the release this tool patched)."""
        return {InstallState.PATCHED: 0, InstallState.UNSUPPORTED: 2}.get(self.data["install"]["state"], 1)

    @property
    def outcome(self) -> tuple[str, str]:
        """This host's (outcome, reason) in a run over several hosts: the install's state and
        its reason (``install_state``)."""
        return self.data["install"]["state"], self.data["install"]["reason"]


def status(snap: Snapshot, chosen, transport=None) -> Status:
    """``status``: what ``apply`` would find, file by file and patch by patch, and the
    install's state (``install_state``), as a ``Status``. With a ``transport``, an install
    the record calls ``patched`` is checked as ``verify`` checks it (its static checks, one
    ``sources`` exchange) and called ``broken`` when they fail (``checks.install_verdict``),
    naming ``verify`` as the way to see each break. Raises ``UserError``
    (``Unsupported`` when no patch is written for the target's speculators or vLLM) as
    ``engine.check_supported``, and in ``apply``'s words when files hold this tool's fixes
    but no record names them (``refuse_lost_state``: the state was lost, never "changed by
    hand"). Ways out are ``patcher.ways.Way`` tokens in the text, worded by the front end."""
    from patcher import engine
    from patcher.checks.verify import recorded_states

    engine.check_supported(snap)
    plans = engine.plan(snap, chosen)
    if not engine.refusals(plans):  # as apply refuses: its words, its exit code (2)
        refuse_lost_state(snap, "status", plans)
    rows = outcome_rows(plans)
    moved = recorded_states(snap, plans)  # applied by us for another vLLM (upgraded or downgraded since)
    for r in rows:
        r["state"] = moved.get(r["id"], r["state"])
    mark_edited(source_changes(snap), rows, "state")
    mark_other_versions(snap.version_changes(), rows, "state")
    # every file this run's patches name and every file the record names (of another release too)
    files = {path: snap.file_state(path) for path in sorted({p.path for p in plans} | set(snap.recorded_paths()))}
    state, reason = install_state(rows, files, snap.vllm_version or "")
    if snap.replaced_from:  # what pip did is pip's doing: never "changed by hand"
        state, reason = InstallState.REINSTALLED, f"{snap.installer_did}; `{Way('repair')}` drops that record"
    elif snap.installer_did and state in (
        InstallState.PRISTINE,
        InstallState.PARTIAL,
    ):  # --force-reinstall of the same release
        state, reason = (
            InstallState.REINSTALLED,
            (f"{snap.installer_did}; `{Way('apply')}` patches them again, `{Way('revert')}` drops their record"),
        )
    elif state == InstallState.PATCHED and transport is not None:
        state, reason = checked_state(transport, snap)
    if snap.training_only:  # the state of the training half: never a word on the half nothing read
        reason = "; ".join(filter(None, [reason, TRAINING_HALF_ONLY]))
    found = Status(
        plans,
        rows,
        files,
        {**describe(snap), "files": files, "patches": rows, "install": {"state": state, "reason": reason}},
    )
    found.data["summary"] = found.summary
    return found


def checked_state(transport, snap: Snapshot) -> tuple[str, str]:
    """(state, reason) of an install the record calls patched, once verify's static checks
    have read it: ``patched`` when they pass, else ``broken`` with what failed."""
    from patcher.checks.install_verdict import BROKEN, broken_reason, static_failures
    from patcher.commands.verify import NO_PROOF, check_install
    from patcher.connect.session import Session

    with Session.of(transport) as session:
        check = check_install(session, snap, set(snap.patches.ids()))
    failures = static_failures(check.failing, NO_PROOF)
    if failures:
        return BROKEN, broken_reason(failures)
    return InstallState.PATCHED, ""


# A patch's states that leave it out of the installed code (``install_state``).
NOT_APPLIED = ("pending", "refused", "stale", "source-changed", "other-version")


def install_state(rows: list[dict], files: dict[str, str], vllm: str = "") -> tuple[str, str]:
    """(state, reason) of the install from ``status``'s rows and file states: ``modified``
    (a file changed after patching, or differing from what pip installed with no record),
    ``unsupported`` (a patch's vLLM fact is missing: no patch here handles this vLLM),
    ``stale`` (patches applied for another vLLM release, ``vllm`` being the installed one),
    ``patched`` (every needed patch is in), ``pristine`` (none applied by this tool) or
    ``partial``; the reason names the files or patches (and for ``stale`` the way out), empty
    when patched."""
    changed = [p for p, state in files.items() if state in (FileState.MODIFIED, FileState.EDITED)]
    if changed:
        return InstallState.MODIFIED, f"changed by hand: {', '.join(changed)}"
    unsupported = unsupported_reason(rows)
    if unsupported:  # the words apply and diff refuse in
        return InstallState.UNSUPPORTED, unsupported
    stale = sorted({r["id"] for r in rows if r["state"] == "stale"})
    if stale:
        return InstallState.STALE, stale_reason(stale, vllm)
    others = sorted({r["id"] for r in rows if r["state"] == "other-version"})
    if others:
        ways = " and ".join(f"`{Way('revert', ('--only', pid))}`" for pid in others)
        return (
            InstallState.PARTIAL,
            f"{', '.join(others)} applied at another version of the patch: {ways}, then `{Way('apply')}`",
        )
    missing = sorted({r["id"] for r in rows if r["state"] in NOT_APPLIED})
    if not missing:
        return InstallState.PATCHED, ""
    if not any(r["state"] == "applied" for r in rows):
        return InstallState.PRISTINE, f"needed, not applied: {', '.join(missing)}"
    return InstallState.PARTIAL, f"needed, not applied: {', '.join(missing)}"


def stale_reason(ids: list[str], vllm: str) -> str:
    """Why patches applied for another vLLM release are wrong here, and the way out, in one
    clause (``status``'s reason, ``apply``'s summary)."""
    return (
        f"{', '.join(ids)} applied for another vLLM release, wrong for vLLM {vllm}: "
        f"take them out with `{Way('revert')}`, then `{Way('apply')}` for this release"
    )

"""What every verb shares: the target described, the notes under a result, the rows of
patch outcomes, and the rule for user patches edited since they were applied."""

from __future__ import annotations

from typing import TYPE_CHECKING

import patcher
from patcher.errors import UserError
from patcher.states import FileState, InstallState
from patcher.ways import Way

if TYPE_CHECKING:
    from patcher.engine import FilePlan, Snapshot
    from patcher.fixes.patch import Patch


def describe(snap: Snapshot) -> dict:
    """Where the target is: the keys every verb's data starts with."""
    return {
        "target": snap.label,
        "python": snap.python,
        "site_packages": snap.site_packages,
        "speculators": snap.speculators_version,
        "speculators_root": snap.speculators_root,
        "editable_source": snap.editable_source,
        "vllm": snap.vllm_version,
    }


def notes(snap: Snapshot, installer: bool = True) -> list[str]:
    """What the user should know about the install whatever the verb (one line each);
    ``installer``: with what an installer did to the patched files (``repair``, which has
    just dealt with it, says so in its own lines)."""
    notes = []
    if snap.editable_source:
        notes.append(f"speculators is an editable install: patching the source at {snap.speculators_root}")
    if snap.recovered:
        notes.append("an interrupted commit was found and rolled back: the install is as it was before it")
    if snap.raced:  # the loser of a race says what it found, never as if it had found the install as before
        notes.append(
            "another speculators-patch run changed this install between this run's read and its commit; "
            "this run read it again and answers for what it found then"
        )
    if installer and snap.installer_did:  # what pip did is pip's doing, never a hand edit
        way = (
            f"`{Way('repair')}` drops the record"
            if snap.replaced_from
            else f"`{Way('apply')}` patches them again, `{Way('revert')}` drops their record"
        )
        notes.append(f"{snap.installer_did}; {way}")
    from patcher.engine.snapshot import state_written_by

    written_by = state_written_by(snap)
    if written_by is not None and str(written_by) != patcher.__version__:
        notes.append(
            f"{snap.state_dir}/manifest.json was written by speculators-patch {written_by}; read by this "
            f"speculators-patch {patcher.__version__}, which records its own version at its next write"
        )
    from patcher.fixes.support import outside_range, transformers_outside

    if not snap.training_only and snap.speculators_version:
        # never called supported where the support statement does not say so
        notes.append(outside_range(snap.speculators_version, snap.vllm_version))
    if snap.training_only:  # every verb says which half it did not look at, and what it judged against
        notes += [snap.not_checked, transformers_outside(snap.libraries.version_of("transformers"))]
    if snap.unfinished:
        notes.append(snap.unfinished)
    elif snap.journal_pending:
        notes.append(
            f"an interrupted commit left {snap.state_dir}/journal.json; it could not be rolled back "
            "(read-only?) and will be on the next writable run"
        )
    return [note for note in notes if note]  # a range check with nothing to say gives ""


def unsupported_reason(rows: list[dict]) -> str:
    """Why the install is unsupported when a patch's vLLM fact is missing in ``rows``
    (``outcome_rows``): ``no patch handles this vLLM (ID: fact missing)``; "" when none is.
    ``status`` says ``install is unsupported (REASON)`` (exit 2); ``apply`` and ``diff`` say the
    same words, write nothing and exit 2 (docs/design.md, "one support verdict")."""
    gone = sorted({r["id"] for r in rows if r["state"] == "fact-missing"})
    return f"no patch handles this vLLM ({', '.join(gone)}: fact missing)" if gone else ""


def outcome_rows(plans: list[FilePlan]) -> list[dict]:
    """One row per patch and file: id, name, version, file, state, detail and, for a user
    patch, where it comes from."""
    from patcher.fixes.userpatches.loader import origin_fields

    return [
        {
            "id": o.patch.id,
            "name": o.patch.name,
            "version": o.patch.version,
            "file": p.path,
            "state": o.state,
            "detail": o.detail,
            **origin_fields(o.patch),
        }
        for p in plans
        for o in p.outcomes
    ]


# What each verb keeps whole of the ``requires`` links when ``--only``/``--skip`` choose
# (``PatchSet.select``'s ``keep``): apply and diff what a chosen patch requires, revert what
# depends on a dropped patch; status and verify read any choice.
KEEP = {"apply": "requires", "diff": "requires", "revert": "dependents", "status": None, "verify": None}


def chosen(snap: Snapshot, verb: str, only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> tuple[Patch, ...]:
    """The patches of ``snap.patches`` that ``only``/``skip`` (ids or names) choose for
    ``verb`` (a key of ``KEEP``), in set order; for ``revert`` the dependents kept are those
    applied on ``snap``. The command line and the Ansible plugins both choose here. Raises
    ``UserError`` as ``PatchSet.select``, and ``KeyError`` for an unknown ``verb``.

    Without vLLM (``Snapshot.training_only``) every verb but ``revert`` gets the training half
    only (``Snapshot.judged``), and an ``only`` that names a data-generation patch is refused:
    nothing here can judge it. ``revert`` takes back whatever is recorded, either half."""
    keep = KEEP[verb]
    applied = snap.applied_ids() if keep == "dependents" else None
    picked = snap.patches.select(tuple(only), tuple(skip), keep, applied)
    if verb == "revert" or not snap.training_only:
        return picked
    unjudged = [p.id for p in picked if p not in snap.judged(picked)]
    if only and unjudged:
        raise UserError(
            f"{', '.join(unjudged)}: data-generation patch{'es' if len(unjudged) > 1 else ''} (speculators/"
            f"data_generation/, which imports vLLM); no vLLM is installed in {snap.site_packages}, so {verb} "
            f"cannot judge {'them' if len(unjudged) > 1 else 'it'}; nothing was changed"
        )
    return snap.judged(picked)


def source_changes(snap: Snapshot) -> list[dict]:
    """Loaded user patches applied to ``snap`` whose source changed since they were applied."""
    from patcher.fixes.userpatches import record

    return record.source_changes(snap.manifest, snap.patches.user_patches(), snap.applied_ids())


def refuse_edited_user_patches(snap: Snapshot, ids: set[str], what: str) -> None:
    """Raise ``UserError`` (the way out named) when ``what`` would apply one of ``ids``
    whose file changed since it was applied (``source_changes``), whatever the version:
    the installed code is the old fix, which the new codemod would meet as unknown code."""
    for change in source_changes(snap):
        pid = change["id"]
        if pid in ids:
            raise UserError(
                f"{pid} was applied from {change['recorded_source'] or 'another file'} (sha256 "
                f"{change['recorded_sha256'][:12]}); {change['source']} now differs (sha256 "
                f"{change['sha256'][:12]}), and {what} would apply it over the old fix: "
                f"'revert --only {pid}' first (it needs no old file), then apply the new one"
            )


def refuse_other_versions(snap: Snapshot, ids: set[str], what: str) -> None:
    """Raise ``UserError`` (the way out named) when ``what`` would apply one of ``ids`` that
    the record says was applied at another version of this tool's patch
    (``Snapshot.version_changes``): its codemod would take the old fix for its own and leave it."""
    for change in snap.version_changes():
        pid = change["id"]
        if pid in ids:
            raise UserError(
                f"{pid} was applied at version {change['recorded_version']}; this speculators-patch has version "
                f"{change['version']}, and {what} would keep the old fix as if it were the new one: "
                f"`{Way('revert', ('--only', pid))}` first, then `{Way('apply')}`"
            )


def refuse_before_planning(snap: Snapshot, chosen, verb: str) -> None:
    """What ``apply`` and ``diff`` both refuse before planning ``chosen`` (one line, nothing
    changed): speculators replaced by an installer since it was patched, a speculators no patch
    is written for, a vLLM change no patch covers, a user patch edited since it was applied.
    Raises ``UserError`` (``Unsupported`` for an unsupported speculators)."""
    from patcher import engine

    refuse_replaced(snap, verb)
    engine.check_supported(snap)
    engine.check_covered(snap)
    refuse_edited_user_patches(snap, {p.id for p in chosen}, verb)
    refuse_other_versions(snap, {p.id for p in chosen}, verb)


def refuse_replaced(snap: Snapshot, verb: str) -> None:
    """Raise ``UserError`` when an installer replaced speculators by another release since
    this tool patched it (``Snapshot.replaced_from``): ``verb`` would mix the record of one
    release with the files of another. Named as the installer's doing (its dist-info's
    INSTALLER), with ``repair`` as the way out."""
    if not snap.replaced_from:
        return
    from patcher.fixes.registry import shipped_patches, written_for

    then = (
        f", then `{Way('apply')}` patches {snap.speculators_version}"
        if written_for(snap.speculators_version, shipped_patches())
        else ""
    )
    raise UserError(
        f"{snap.installer_did}; {verb} would mix that record with {snap.speculators_version}'s files; nothing was "
        f"changed; `{Way('repair')}` drops the record and its copies{then}"
    )


def refuse_lost_state(snap: Snapshot, what: str, plans: list[FilePlan] | None = None) -> None:
    """Raise ``UserError`` when the target's state records no file but files this tool reads
    differ from what pip installed (their ``RECORD``): ``revert`` cannot restore them, and an
    ``apply`` that finds its fixes already in them would call the install patched. ``plans``
    (``apply``): refuse only for files on which a needed fix is found already there
    (``satisfied``), so a hand edit without the fixes is patched as before."""
    if snap.recorded_paths() or snap.state_problem:
        return
    edited = sorted(p for p in snap.files if snap.file_state(p) == FileState.EDITED)
    fixes = []
    if plans is not None:
        found = {p.path: sorted(o.patch.id for o in p.outcomes if o.state == "satisfied") for p in plans}
        edited = [p for p in edited if found.get(p)]
        fixes = sorted({pid for p in edited for pid in found[p]})
        fixes = fixes[:3] + ([f"{len(fixes) - 3} more"] if len(fixes) > 3 else [])
    if not edited:
        return
    one = len(edited) == 1
    holding = f", with this tool's fixes already in ({', '.join(fixes)})," if fixes else ""
    state = f"{snap.state_dir} records no file" if snap.state_exists else f"there is no {snap.state_dir}"
    raise UserError(
        f"{', '.join(edited)} {'differs' if one else 'differ'} from what pip installed ({'its' if one else 'their'} "
        f"RECORD){holding} but {state}: speculators-patch's state was lost (or the files "
        f"were edited by hand), so {what} cannot tell what it wrote there; nothing was changed; "
        f"`{Way('repair')}` says what each file is, and "
        f"pip install --force-reinstall --no-deps speculators=={snap.speculators_version} restores them"
    )


def hand_edited(snap: Snapshot, plans: list[FilePlan]) -> list[str]:
    """The files of ``snap`` changed by hand, never by this tool: no record names them, they
    differ from what pip installed (``FileState.EDITED``) and ``plans`` find none of this
    tool's fixes in them (a file that holds one lost its record: ``refuse_lost_state``)."""
    return snap.edited_without({p.path for p in plans if any(o.state == "satisfied" for o in p.outcomes)})


def hand_edit_words(paths: list[str], verb: str) -> str:
    """``paths`` (``hand_edited``) named as the hand edit they are, and that ``verb`` leaves
    them as they are, in one clause."""
    one = len(paths) == 1
    return (
        f"{', '.join(paths)} {'differs' if one else 'differ'} from what pip installed ({'its' if one else 'their'} "
        f"RECORD) but {'holds' if one else 'hold'} none of this tool's fixes: changed by hand, not by "
        f"speculators-patch; {verb} leaves {'it as it is' if one else 'them as they are'}"
    )


# The states ``status`` gives an install (``commands.status.install_state``); a host whose
# outcome is one of these was read (``unsupported`` too: its speculators or vLLM was).
INSTALL_STATES = tuple(InstallState)


def hosts_summary(outcomes: list[str]) -> str:
    """The last line of a run over several hosts, computed from each host's outcome alone:
    ``N host(s): 2 patched, 1 failed``, and for ``status`` (outcomes that are install states)
    a tail that says only what those outcomes show: some hosts read are patched and some not
    (``the hosts disagree``), none of them is (``it is not patched`` for one host), or every
    host read is patched but some could not be read; none when every host is patched."""
    counts = {o: outcomes.count(o) for o in dict.fromkeys(outcomes)}
    line = f"{len(outcomes)} host{'' if len(outcomes) == 1 else 's'}: " + ", ".join(
        f"{n} {o}" for o, n in counts.items()
    )
    read = [o for o in outcomes if o in INSTALL_STATES]
    unread = len(outcomes) - len(read)
    if not any(o in INSTALL_STATES and o != InstallState.UNSUPPORTED for o in outcomes):  # not status, or none read
        return line
    patched = read.count(InstallState.PATCHED)
    if patched == len(read):
        return line + (f": {unread} not read" if unread else "")
    if patched:
        return f"{line}: the hosts disagree"
    if len(outcomes) == 1:
        return f"{line}: it is not patched"
    return f"{line}: none {'of those read ' if unread else ''}is patched"

"""``verify``: do the installed vLLM's API and the installed speculators agree?

For every fact a patch relies on, the static evidence (file:line and the signature or field
found); then for every patch, whether the installed vLLM needs it and whether the installed
speculators has it. Nothing is imported and nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from patcher.engine import FilePlan, Snapshot, plan
from patcher.errors import UserError
from patcher.fixes.library_source import Evidence
from patcher.fixes.patch import Patch, VllmFact
from patcher.ways import Way

if TYPE_CHECKING:  # the call check's modules are imported by verify_calls (status needs none)
    from patcher.checks.callsite import Checked, Finding
    from patcher.checks.import_path import ImportPathCheck
    from patcher.checks.library_calls import LibraryCalls
    from patcher.checks.model_runner import RunnerCheck
    from patcher.connect.session import Session


STALE_FIX = f"{Way('revert')} && {Way('apply')}"  # a stale patch's way out


@dataclass
class FactCheck:
    patch: Patch
    fact: VllmFact
    evidence: Evidence


@dataclass
class PatchCheck:
    """``verdict``: ``ok`` | ``missing`` (needed, not applied) | ``stale`` (applied by us
    for another vLLM, not portable, and the installed vLLM does not need it: its code
    targets an API this vLLM lacks) | ``refused`` (unrecognised code) | ``fact-missing``
    (a symbol its fact is about is gone from this vLLM; ``needed`` is then None: unknown)."""

    patch: Patch
    needed: bool | None
    state: str
    verdict: str
    hint: str = ""


def verdicts(snap: Snapshot) -> tuple[list[FactCheck], list[PatchCheck]]:
    """Check every patch written for the installed speculators against the snapshot (no
    writes, no imports)."""
    patches = snap.applicable
    facts = [FactCheck(p, f, snap.evidence[(p.id, f.symbol)]) for p in patches for f in p.facts]
    checks: list[PatchCheck] = []
    plans: list[FilePlan] = plan(snap, patches)
    for file_plan in plans:
        recorded = snap.recorded(file_plan.path)
        for o in file_plan.outcomes:
            needed = o.state != "not-needed"
            if o.state == "fact-missing":
                checks.append(
                    PatchCheck(
                        o.patch, None, "applied" if o.patch.id in recorded else "not applied", "fact-missing", o.detail
                    )
                )
            elif o.state == "pending":
                checks.append(PatchCheck(o.patch, needed, o.state, "missing", str(Way("apply"))))
            elif o.state == "refused":
                checks.append(PatchCheck(o.patch, needed, o.state, "refused", o.detail))
            elif o.state == "not-needed" and o.patch.id in recorded and not o.patch.portable:
                # Applied for another vLLM (upgrade or downgrade since): its code targets an
                # API this vLLM does not have. Re-derive the patch set for the installed vLLM.
                checks.append(PatchCheck(o.patch, False, "applied", "stale", STALE_FIX))
            elif o.state == "not-needed" and o.patch.id in recorded:
                checks.append(PatchCheck(o.patch, False, "applied", "ok"))  # portable: right here too
            else:
                checks.append(PatchCheck(o.patch, needed, o.state, "ok"))
    return facts, checks


def recorded_states(snap: Snapshot, plans: list[FilePlan]) -> dict[str, str]:
    """For ``status``: patches applied by us that the installed vLLM does not need (it
    changed since): ``stale`` when their code targets another vLLM's API, else ``applied``."""
    states = {}
    for file_plan in plans:
        recorded = snap.recorded(file_plan.path)
        for o in file_plan.outcomes:
            if o.state == "not-needed" and o.patch.id in recorded:
                states[o.patch.id] = "applied" if o.patch.portable else "stale"
    return states


@dataclass
class CallsCheck:
    """The generic call-site check (``patcher.checks.callsite``), and with ``--runtime`` the same
    calls re-checked against the live vLLM objects (``patcher.checks.runtime``); the import path
    of the generator (``patcher.checks.import_path``) and which model runner vLLM's GPU worker
    builds (``patcher.checks.model_runner``), read in the same exchange."""

    findings: list[Finding]
    checked: list[Checked]
    runtime: object | None = None  # patcher.checks.runtime.RuntimeReport
    imports: ImportPathCheck | None = None
    runner: RunnerCheck | None = None
    vllm: dict | None = None  # the vLLM files the checks computed on each run read (lifecycle, model runner)
    library: LibraryCalls | None = None  # the training half's calls into transformers and torch

    @property
    def all_findings(self) -> list[Finding]:
        """The calls into vLLM's findings, then those into transformers and torch."""
        return self.findings + (self.library.findings if self.library is not None else [])

    @property
    def ok(self) -> bool:
        errors = [f for f in self.all_findings if f.severity == "error"]
        if self.runtime is not None:
            errors += [f for f in self.runtime.findings if f.severity == "error"] + self.runtime.disagreements
        return not errors

    @property
    def imports_ok(self) -> bool:
        return self.imports is None or self.imports.ok

    @property
    def runner_ok(self) -> bool:
        return self.runner is None or self.runner.severity != "error"


def _v2_fix(snap: Snapshot) -> str | None:
    """The patch that makes the installed speculators read Model Runner V2's batch
    (``runner_batch="v2"``: patches/sp022_model_runner_v2_capture.py, written for 0.3.0), or
    None for a speculators no such patch is written for (0.4.x)."""
    return next((p.id for p in snap.applicable if p.checks.runner_batch == "v2"), None)


def _sources_request(snap: Snapshot, runtime: bool = False) -> tuple[dict, dict | None]:
    """The ``sources`` request of ``verify_calls`` (without ``expect``) and the cached entry
    whose ``reads`` it sends as ``expect`` (None: read in full)."""
    from patcher.checks import calls_cache, callsite, checklist, library_calls

    if snap.training_only:  # no vLLM: only the training half's calls into transformers and torch
        return {
            "site_packages": snap.site_packages,
            "speculators_dir": callsite.SPECULATORS_DIR,
            "libraries": library_calls.request(),
        }, None
    request = {
        "site_packages": snap.site_packages,
        "speculators_dir": callsite.SPECULATORS_DIR,
        **checklist.ask(snap),  # what each check of verify asks the target
        "libraries": library_calls.request(),
    }
    return request, None if runtime else calls_cache.lookup(snap, request)


def _first_reader(session: Session, snap: Snapshot, runtime: bool) -> tuple[dict, dict | None]:
    """``_sources_request``, and where the controller holds no entry for it: the lock of
    the request's entry (``calls_cache.lock``), held by ``session`` until
    ``verify_calls`` has stored what it read. Of several hosts with the same files (a
    fan-out's forked workers), the first reads in full and the others wait, then send its
    record as ``expect`` and are answered ``unchanged``: eight identical hosts cost one
    call check, as they cost one plan."""
    from patcher.checks import calls_cache

    request, earlier = _sources_request(snap, runtime)
    if earlier is None and not runtime and not snap.training_only:
        lock = calls_cache.lock(request)
        lock.__enter__()
        request, earlier = _sources_request(snap, runtime)  # stored by another host meanwhile?
        if earlier is None:
            session.held.push(lock.__exit__)  # left by ``verify_calls``, or at the session's end
        else:
            lock.__exit__(None, None, None)
    return request, earlier


def send_calls_ahead(session: Session, snap: Snapshot) -> tuple[dict, dict | None]:
    """Have ``verify_calls``'s ``sources`` request ride on the session's next request
    (``Session.send_ahead``): ``apply`` sends it with its commit, so checking the
    install it just wrote costs no round trip of its own. Returns what was sent (the
    request and the cached entry it expects), for ``verify_calls(sent_ahead=...)``."""
    request, earlier = _first_reader(session, snap, False)
    session.send_ahead("sources", **request, expect=earlier["reads"] if earlier else None)
    return request, earlier


def verify_calls(
    session: Session, snap: Snapshot, runtime: bool = False, sent_ahead: tuple[dict, dict | None] | None = None
) -> CallsCheck:
    """One ``sources`` exchange (plus one ``run_python`` with ``runtime``): every call from
    speculators' data-generation modules into vLLM, checked against the installed vLLM;
    the imports the generator's import runs; the model runner switch. ``sent_ahead``: what
    ``send_calls_ahead`` returned, whose answer then costs no exchange; the cache is not
    looked up again (another run may have stored a newer entry since, and the answer that
    came back was made against the one sent).

    Without ``runtime`` the findings of an earlier run on this target are reused when the
    agent confirms that nothing they were computed from changed (``patcher.checks.calls_cache``)."""
    from patcher.agent.pysource import gc_paused

    request, earlier = sent_ahead if sent_ahead is not None and not runtime else _first_reader(session, snap, runtime)
    try:
        with gc_paused():  # hundreds of files parsed: the collector's passes cost more than parsing
            return _verify_calls(session, snap, runtime, request, earlier)
    finally:  # what was read is stored (or failed): hosts waiting for it go on
        session.release()


def _verify_calls(transport: Session, snap: Snapshot, runtime: bool, request: dict, earlier: dict | None) -> CallsCheck:
    from patcher.checks import (
        attribute_reads,
        calls_cache,
        callsite,
        import_path,
        library_calls,
        model_runner,
        torch_builds,
    )

    if snap.training_only:
        return _training_calls(transport, snap, runtime, request)
    answer = transport.request("sources", **request, expect=earlier["reads"] if earlier else None)
    stored = calls_cache.restore(earlier) if answer.get("unchanged") and earlier is not None else None
    versions = library_calls.versions(answer)
    if stored is not None:
        findings, checked, imports, vllm = stored
        runner = model_runner.check(
            vllm, answer["env"].get(model_runner.VARIABLE), snap.files.get(model_runner.EXTENSION), _v2_fix(snap)
        )
        ours, library = _split(findings, checked, versions)
        return CallsCheck(*ours, None, torch_builds.joined(imports, answer), runner, vllm, library)
    if answer.get("unchanged"):  # an entry that cannot be read back: read in full
        answer = transport.request("sources", **request)
        versions = library_calls.versions(answer)
    speculators, vllm = callsite.decode(answer)
    checked: list[Checked] = []
    index = callsite.Index(vllm)  # each vLLM module parsed once for both checks
    findings = callsite.check(speculators, vllm, checked, index) + attribute_reads.check(speculators, vllm, index)
    library = library_calls.LibraryCalls(versions)
    training, library_files = library_calls.decode(answer)
    installed = tuple(lib for lib, version in versions.items() if version is not None)
    library.findings = library_calls.check(training, library_files, library.checked, installed=installed)
    imports = import_path.check(answer["import_path"])
    runner = model_runner.check(
        vllm, answer["env"].get(model_runner.VARIABLE), snap.files.get(model_runner.EXTENSION), _v2_fix(snap)
    )
    if not runtime:
        calls_cache.save(
            snap,
            request,
            answer.get("reads"),
            findings + library.findings,
            checked + library.checked,
            imports,
            vllm,
            answer.get("unparsed"),
        )
        return CallsCheck(findings, checked, None, torch_builds.joined(imports, answer), runner, vllm, library)
    from patcher.checks.runtime import runtime_verify  # only verify --runtime needs it (vLLM's calls)

    report = runtime_verify(transport, snap.site_packages, checked, findings, callsite.WORKER)
    return CallsCheck(findings, checked, report, torch_builds.joined(imports, answer), runner, vllm, library)


def _training_calls(transport: Session, snap: Snapshot, runtime: bool, request: dict) -> CallsCheck:
    """Without vLLM (``Snapshot.training_only``): the calls of speculators' training half
    into transformers and torch, read afresh in one ``sources`` exchange (nothing of vLLM's to
    check or to keep). Raises ``UserError`` for ``runtime``: it imports vLLM."""
    from patcher.checks import library_calls

    if runtime:
        raise UserError(
            f"--runtime re-checks the calls into vLLM by importing it; no vLLM is installed in "
            f"{snap.site_packages}: verify without it checks the training half"
        )
    answer = transport.request("sources", **request, expect=None)
    versions = library_calls.versions(answer)
    library = library_calls.LibraryCalls(versions)
    training, library_files = library_calls.decode(answer)
    installed = tuple(lib for lib, version in versions.items() if version is not None)
    library.findings = library_calls.check(training, library_files, library.checked, installed=installed)
    return CallsCheck([], [], library=library)


def _split(
    findings: list[Finding], checked: list[Checked], versions: dict[str, str | None]
) -> tuple[tuple[list[Finding], list[Checked]], LibraryCalls]:
    """A cached entry's findings and checked calls, vLLM's apart from transformers' and torch's."""
    from patcher.checks.library_calls import LibraryCalls, library_of

    library = LibraryCalls(
        versions,
        [c for c in checked if library_of(c.target[0]) != "vLLM"],
        [f for f in findings if f.library != "vLLM"],
    )
    ours = ([f for f in findings if f.library == "vLLM"], [c for c in checked if library_of(c.target[0]) == "vLLM"])
    return ours, library

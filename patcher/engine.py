"""The engine: read a target, plan the rewrite, commit it, revert it, check it.

It knows nothing about any particular patch: it runs each ``Patch``'s codemod in order on
each file's current source, and leaves reading and writing to the agent over a transport
(two exchanges for ``apply``: one ``inspect``, one ``commit``).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

import patcher
from patcher import cache, fast_path, plan_cache
from patcher.errors import UserError
from patcher.patch import Patch, PatchRefused
from patcher.registry import add_recorded, all_patches, shipped_patches
from patcher.transport import Transport
from patcher.userpatches import record as user_records
from patcher.vllm_source import Evidence, VllmSource

if TYPE_CHECKING:  # libcst is imported only where a codemod must really run (docs/speed.md)
    import libcst as cst

def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unb64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


_HAVE_MAX = 256  # digests sent as ``have``: 17 KB of request at most


class _NotHeld(Exception):
    """The agent named a content by digest that the controller cache no longer holds."""


def _content(value: str | dict | None, digests: set[str]) -> bytes | None:
    """A file in an ``inspect`` answer: base64 (kept in the controller cache for the next
    run), ``{"sha256": hex}`` (read from that cache) or None; its digest goes to ``digests``."""
    if isinstance(value, dict):
        data = cache.load_blob(value["sha256"])
        if data is None:
            raise _NotHeld(value["sha256"])
        digests.add(value["sha256"])
        return data
    data = _unb64(value)
    if data is not None:
        digests.add(cache.store_blob(data))
    return data


def _inspect(transport: Transport, request: dict) -> tuple[dict, dict]:
    """The ``inspect`` exchange, asking only for contents the controller cache does not
    hold: the fact files, speculators' files and pristine copies are the same on every
    run and host until something is installed (0.77 MB for speculators 0.3.0 and vLLM
    0.16). ``have`` is the digests of the last answers to the same request, from any
    target. Returns the answer as sent and its contents as bytes
    (``{"speculators": {path: bytes}, "vllm": ..., "pristine": ..., "backups": ...}``)."""
    remembered = cache.key(request)
    have = cache.load("inspect-have", remembered) if cache.enabled() else None
    answer = transport.request("inspect", **request, have=have or None)
    try:
        contents, held = _decode_contents(answer)
    except _NotHeld:  # the cache was emptied since: read again in full, keep what the first read recovered
        first = answer
        answer = transport.request("inspect", **request)
        answer["recovered"] = first.get("recovered") or answer.get("recovered", False)
        contents, held = _decode_contents(answer)
    # This answer's digests first, then earlier ones (a fleet on two vLLM releases), bounded.
    kept = (sorted(held) + [d for d in have or [] if d not in held])[:_HAVE_MAX]
    if kept != have:
        cache.store("inspect-have", remembered, kept)
    return answer, contents


def _decode_contents(answer: dict) -> tuple[dict, set[str]]:
    """Every file content of an ``inspect`` answer as bytes (None for a missing file), and
    the sha256 of each."""
    held: set[str] = set()
    vllm = answer["vllm"]
    contents = {
        "speculators": {k: _content(v, held) for k, v in answer["speculators"]["files"].items()},
        "vllm": {} if vllm is None else {k: _content(v, held) for k, v in vllm["files"].items()},
        "pristine": {k: _content(v, held) for k, v in answer["pristine"].items()},
        "backups": {k: [_content(d, held) for d in v] for k, v in answer.get("backups", {}).items()},
    }
    return contents, held


@dataclass
class Snapshot:
    """Everything read from a target in one ``inspect`` exchange.

    ``files`` and ``pristine`` map speculators paths (``speculators/...py``, relative to its
    import root) to bytes; ``vllm`` is ``None`` when no vLLM is installed.
    """

    label: str
    python: str
    python_version: str
    site_packages: str
    state_dir: str
    speculators_version: str | None
    speculators_root: str
    editable_source: str | None
    files: dict[str, bytes | None]
    vllm: VllmSource | None
    vllm_root: str | None
    manifest: dict | None
    pristine: dict[str, bytes | None]
    journal_pending: bool
    recovered: bool = False
    manifest_sha256: str | None = None
    state_problem: str | None = None
    backups: dict[str, list[bytes]] = field(default_factory=dict)
    record: dict[str, str] = field(default_factory=dict)
    dist_info: str | None = None
    record_differs: list[str] | None = None  # asked by repair: files differing from pip's RECORD

    @cached_property
    def evidence(self) -> dict[tuple[str, str], Evidence]:
        """Evidence per (patch id, fact symbol), each probe run once (or read from the cache
        of evidence for these very vLLM files: ``fast_path.evidence``)."""
        assert self.vllm is not None
        vllm = self.vllm
        return fast_path.evidence(vllm.files, lambda: {(p.id, f.symbol): f.probe(vllm)
                                                       for p in all_patches() for f in p.facts})

    def file_state(self, path: str) -> str:
        """``pristine`` | ``patched`` | ``reinstalled`` (pristine again after patching) | ``modified``."""
        entry = ((self.manifest or {}).get("files") or {}).get(path)
        current = self.files.get(path)
        if not isinstance(entry, dict) or current is None:
            return "pristine"
        digest = sha256(current)
        if digest == entry.get("patched_sha256"):
            return "patched"
        if digest == entry.get("pristine_sha256"):
            return "reinstalled"
        return "modified"

    def recorded(self, path: str) -> dict[str, int]:
        """Patches the manifest records as applied by us to ``path`` (id -> version)."""
        if self.file_state(path) != "patched":
            return {}
        return dict(self.manifest["files"][path]["patches"])

    def applied_ids(self) -> set[str]:
        """Every patch the manifest records as applied by us, in any file."""
        return {pid for path in (self.manifest or {}).get("files", {}) for pid in self.recorded(path)}


def read_snapshot(transport: Transport, site_packages: str | None = None, tolerate_damage: bool = False,
                  record_check: bool = False) -> Snapshot:
    """One ``inspect`` exchange. The files read are those the patches of this run name and
    every file the target's state names (a user patch on any file, applied earlier, is
    read without its source). ``record_check`` (``repair``): also list the speculators
    files whose bytes differ from pip's RECORD (``Snapshot.record_differs``). Raises
    ``UserError`` when the target has no speculators, or (unless ``tolerate_damage``:
    ``repair``) when its state is inconsistent: one line naming the file at fault and the
    way out."""
    patches = all_patches()
    request = dict(
        site_packages=site_packages,
        speculators_files=sorted({p.file for p in patches}),
        vllm_files=sorted({m for p in patches for f in p.facts for m in f.modules}),
    )
    if record_check:
        request["record_check"] = True
    answer, contents = _inspect(transport, request)
    spec, vllm = answer["speculators"], answer["vllm"]
    vllm_source = None
    if vllm is not None:
        vllm_source = VllmSource(contents["vllm"], ", ".join(vllm["versions"]) or "unknown")
    snap = Snapshot(
        label=transport.label,
        python=answer["python"],
        python_version=answer["python_version"],
        site_packages=answer["site_packages"],
        state_dir=answer["state_dir"],
        speculators_version=spec["version"],
        speculators_root=spec["root"],
        editable_source=spec["editable_source"],
        files=contents["speculators"],
        vllm=vllm_source,
        vllm_root=None if vllm is None else vllm["root"],
        manifest=answer["manifest"],
        pristine=contents["pristine"],
        journal_pending=answer["journal_pending"],
        recovered=answer.get("recovered", False),
        manifest_sha256=answer.get("manifest_sha256"),
        state_problem=answer.get("state_problem"),
        backups=contents["backups"],
        record=spec.get("record") or {},
        dist_info=spec.get("dist_info"),
        record_differs=answer.get("record_differs"),
    )
    if snap.state_problem and not tolerate_damage:
        raise UserError(snap.state_problem)
    if not snap.state_problem:
        add_recorded(snap.manifest)  # user patches applied earlier, nameable without their source
    return snap


def written_for(version: str | None, patches: tuple[Patch, ...]) -> tuple[Patch, ...]:
    """The patches whose ``speculators`` specifier contains ``version`` (none for an
    unparsable or missing version): each speculators release gets only its own codemods."""
    try:
        parsed = Version(version) if version is not None else None
    except InvalidVersion:
        parsed = None
    return tuple(p for p in patches if parsed is not None and parsed in SpecifierSet(p.speculators))


def check_supported(snap: Snapshot) -> None:
    """Raise ``UserError`` unless the target has a speculators some patch is written for, and a vLLM."""
    version = snap.speculators_version
    if version is None:
        where = f"{snap.dist_info}/METADATA" if snap.dist_info else f"{snap.speculators_root} (no dist-info found)"
        raise UserError(f"cannot tell which speculators is installed: {where} has no version; "
                        f"reinstall it with pip (pip install --force-reinstall --no-deps speculators==0.3.0)")
    if not written_for(version, shipped_patches()):
        specifiers = sorted({p.speculators for p in shipped_patches()})
        raise UserError(
            f"speculators {version} is not supported: speculators-patch has no patches for it "
            f"(patches exist for speculators {' and '.join(specifiers)}); nothing was changed"
        )
    if snap.vllm is None:
        raise UserError(f"no vLLM installed in {snap.site_packages}: nothing to patch against")


@dataclass(frozen=True)
class Uncovered:
    """A vLLM change no patch written for ``speculators`` (a PEP 440 specifier) covers,
    recognised by a shipped patch's vLLM fact (``fact``: (patch id, fact symbol)) holding in
    the installed vLLM; ``what``: what then breaks, in words. ``apply`` and ``diff`` refuse
    such a target rather than leave it half-fixed."""

    speculators: str
    fact: tuple[str, str]
    what: str


UNCOVERED = (
    # speculators 0.4.x's generator imports the three KV cache helpers as 0.3.0's does (plus
    # two that stayed in kv_cache_utils), but it also lacks SP020's layout resolution and
    # passes its fixed block size to the Scheduler: a port SP015-SP018 do not make.
    Uncovered("~=0.4.0", ("SP023", "kv_cache_planning.get_kv_cache_config_from_groups"),
              "its generator imports _get_kv_cache_groups_uniform_spec, get_kv_cache_config_from_groups and "
              "unify_hybrid_kv_cache_specs from vllm.v1.core.kv_cache_utils, which this vLLM moved to "
              "kv_cache_planning"),
)


def check_covered(snap: Snapshot) -> None:
    """Raise ``UserError`` (one line: what breaks, the vLLM evidence, the patch that covers it
    for another speculators) when the installed vLLM has a change listed in ``UNCOVERED`` for
    the installed speculators."""
    version = Version(snap.speculators_version)
    by_id = {p.id: p for p in shipped_patches()}
    for uncovered in UNCOVERED:
        evidence = snap.evidence[uncovered.fact]
        if version in SpecifierSet(uncovered.speculators) and evidence.holds:
            pid = uncovered.fact[0]
            raise UserError(f"speculators {snap.speculators_version} on vLLM {snap.vllm.version}: {uncovered.what} "
                            f"({evidence.where}); no patch for speculators {snap.speculators_version} covers it "
                            f"({pid} is written for speculators {by_id[pid].speculators}); nothing was changed")


@dataclass
class Outcome:
    """What one patch does to one file's current source.

    state: ``pending`` (would change the file), ``applied`` (satisfied, recorded by us),
    ``satisfied`` (fix already present, not by us), ``not-needed`` (the installed vLLM
    does not have the incompatibility), ``fact-missing`` (a symbol its fact is about is not
    in the installed vLLM: ``fact_missing``), ``refused`` (unknown code; ``detail`` says where).
    """

    patch: Patch
    state: str
    detail: str = ""


@dataclass
class FilePlan:
    """One file: its bytes before and after the selected patches, and each patch's outcome."""

    path: str
    before: bytes
    after: bytes
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.before != self.after


def _parser_config(python_version: str) -> cst.PartialParserConfig:
    import libcst as cst

    known = cst.KNOWN_PYTHON_VERSION_STRINGS
    version = python_version if python_version in known else max(known, key=lambda v: tuple(map(int, v.split("."))))
    return cst.PartialParserConfig(python_version=version)


def parse(path: str, source: bytes, python_version: str = "3.10") -> cst.Module:
    """Parse with the target interpreter's grammar. Raises ``UserError`` on a syntax error."""
    import libcst as cst

    try:
        return cst.parse_module(source, config=_parser_config(python_version))
    except (UnicodeError, LookupError, ValueError, SyntaxError) as e:  # undecodable bytes, a bad coding cookie, NUL
        raise UserError(f"{path}: cannot be read as Python source ({type(e).__name__}: {e}); reinstall speculators") from None
    except cst.ParserSyntaxError as e:
        line = e.raw_line
        try:  # CPython names the offending line more precisely than libcst's parser
            compile(source, path, "exec", dont_inherit=True)
        except SyntaxError as exact:
            line = exact.lineno or line
        raise UserError(f"{path}:{line}: syntax error, cannot patch: {e.message}") from None


def transform(patch: Patch, module: cst.Module) -> tuple[str, cst.Module, str]:
    """Run one patch's codemod on a parsed module.

    Returns ``(verdict, module, detail)`` with verdict ``changed``, ``satisfied`` or
    ``refused`` (``detail`` then names file:line and the expected shape).
    """
    import libcst as cst
    from libcst.codemod import CodemodContext, SkipFile

    try:
        new = patch.codemod(CodemodContext(filename=patch.file)).transform_module(module)
        if not isinstance(new, cst.Module):
            raise TypeError(f"transform_module returned {type(new).__name__}, not a libcst Module")
    except SkipFile as e:
        return "satisfied", module, str(e)
    except PatchRefused:
        try:  # again, with positions resolved, to name the line
            patch.codemod.with_positions()(CodemodContext(filename=patch.file)).transform_module(module)
        except PatchRefused as e:
            return "refused", module, str(e)
        raise
    except Exception as e:
        if patch.origin == "shipped":  # our bug: the traceback is the report
            raise
        raise UserError(f"{patch.id} ({patch.origin} {patch.source}): its codemod raised {type(e).__name__}: {e} "
                        f"on {patch.file}; nothing was changed") from None
    if new.code == module.code:
        return "satisfied", module, "already satisfied: no change"
    return "changed", new, ""


def run_codemod(patch: Patch, source: bytes, python_version: str = "3.10") -> tuple[str, bytes, str]:
    """``transform`` on bytes: returns ``(verdict, new_source, detail)``."""
    verdict, module, detail = transform(patch, parse(patch.file, source, python_version))
    return verdict, module.bytes, detail


def needed(snap: Snapshot, patch: Patch) -> bool:
    """A patch is needed when every vLLM fact it depends on holds in the installed vLLM."""
    return all(snap.evidence[(patch.id, f.symbol)].holds for f in patch.facts)


def fact_missing(snap: Snapshot, patch: Patch) -> str:
    """Why ``patch`` can be neither needed nor not needed here: a fact's symbol is not in
    the installed vLLM at all (``Evidence.missing``), one line; "" when every symbol is there."""
    for f in patch.facts:
        e = snap.evidence[(patch.id, f.symbol)]
        if e.missing:
            return (f"vLLM {snap.vllm.version if snap.vllm else ''} has no {f.symbol} ({e.where}: {e.found}): "
                    f"the code {patch.id} rewrites uses it, so it breaks with or without {patch.id}; "
                    f"no patch here handles this vLLM yet (verify's call check names the calls)")
    return ""


def need_state(snap: Snapshot, patch: Patch) -> str:
    """``needed`` | ``not-needed`` | ``fact-missing`` (see ``fact_missing``)."""
    if fact_missing(snap, patch):
        return "fact-missing"
    return "needed" if needed(snap, patch) else "not-needed"


NOT_NEEDED = "the installed vLLM does not need it"


def plan_file(snap: Snapshot, path: str, source: bytes, chosen: tuple[Patch, ...],
              recorded: dict[str, int], only_needed: bool = True, adopting: bool = False) -> FilePlan:
    """Run the chosen patches for ``path`` in order on ``source`` (deterministic).

    With ``only_needed`` (the default) a patch the installed vLLM does not need is skipped
    as ``not-needed``; ``revert --only`` replays the recorded patches regardless.
    ``adopting`` (``apply --adopt``): a modified file is planned afresh, so a recorded user
    patch whose source is not loaded refuses (it would have to run) instead of being shown
    as applied.
    """
    plan = FilePlan(path, source, source)
    module = parse(path, source, snap.python_version)
    for patch in (p for p in chosen if p.file == path):
        gone = fact_missing(snap, patch) if only_needed else ""
        if gone:  # neither needed nor not needed: never shown as calm (verify's verdict fails)
            plan.outcomes.append(Outcome(patch, "fact-missing", gone))
            continue
        if only_needed and not needed(snap, patch):
            plan.outcomes.append(Outcome(patch, "not-needed", NOT_NEEDED))
            continue
        if patch.origin == "recorded" and patch.id in recorded:  # a user patch whose source is not at hand
            plan.outcomes.append(Outcome(patch, "applied", "recorded; source not loaded"))
            continue
        if (patch.origin == "recorded" and only_needed and not adopting and snap.file_state(path) == "modified"
                and patch.id in ((snap.manifest or {}).get("files", {}).get(path) or {}).get("patches", {})):
            # edited since: the record is all there is to show; apply/verify say the file is modified
            plan.outcomes.append(Outcome(patch, "applied", "recorded; source not loaded; the file was modified since"))
            continue
        verdict, module, detail = transform(patch, module)
        if verdict == "changed":
            plan.outcomes.append(Outcome(patch, "pending"))
        elif verdict == "satisfied":
            state = "applied" if patch.id in recorded else "satisfied"
            plan.outcomes.append(Outcome(patch, state, detail))
        else:
            plan.outcomes.append(Outcome(patch, "refused", f"{detail} ({patch.id} {patch.name}; --skip {patch.id} leaves it out)"))
    plan.after = module.bytes
    return plan


def plan(snap: Snapshot, chosen: tuple[Patch, ...], adopting: bool = False) -> list[FilePlan]:
    """Plan every file the chosen patches written for the installed speculators touch
    (``adopting``: see ``plan_file``). Raises ``UserError`` for a missing file."""
    plans = []
    fitting = written_for(snap.speculators_version, chosen)
    if chosen and not fitting:
        raise UserError(f"{', '.join(p.id for p in chosen)}: written for speculators "
                        f"{' and '.join(sorted({p.speculators for p in chosen}))}, not {snap.speculators_version}; "
                        f"nothing was changed")
    chosen = fitting
    for path in sorted({p.file for p in chosen}):
        source = snap.files.get(path)
        if source is None:
            users = [p.id for p in chosen if p.file == path and p.origin != "shipped"]
            if users:  # the user's patch names a file this speculators does not have
                raise UserError(f"{', '.join(users)} patches {path}, which speculators {snap.speculators_version} "
                                f"does not have (under {snap.speculators_root}); nothing was changed")
            raise UserError(f"{path} not found under {snap.speculators_root}: "
                            f"not a speculators {snap.speculators_version} layout")
        recorded = snap.recorded(path)
        if adopting and snap.file_state(path) == "modified":
            plans.append(plan_file(snap, path, source, chosen, recorded, adopting=True))
            continue
        known = fast_path.outcomes(snap, path, source, chosen, recorded)
        plans.append(plan_cache.plan_file(snap, path, source, chosen, recorded) if known is None
                     else FilePlan(path, source, source, known))
    return plans


def refusals(plans: list[FilePlan]) -> list[str]:
    return [o.detail for p in plans for o in p.outcomes if o.state == "refused"]


def _guard_modified(snap: Snapshot, paths: list[str]) -> None:
    for path in paths:
        if snap.file_state(path) == "modified":
            raise UserError(
                f"{path} was modified after patching (sha256 matches neither the pristine nor the "
                f"patched file; updated upstream?); `speculators-patch apply --adopt` keeps it as the new "
                f"pristine copy and patches it"
            )


@dataclass
class CommitResult:
    """``written``: the paths the commit wrote; ``manifest``: the manifest it wrote (None:
    none, or no commit: ``committed`` False)."""

    written: list[str]
    plans: list[FilePlan]
    recovered: bool = False
    manifest: dict | None = None
    committed: bool = False
    adopted: list[str] = field(default_factory=list)  # apply --adopt: files kept as they are, as new pristine


def after(snap: Snapshot, result: CommitResult) -> Snapshot:
    """``snap`` as the target is once ``result``'s commit is done (the files it wrote, the
    manifest it wrote), for checking what was written without reading it again."""
    if not result.committed:
        return snap
    import dataclasses

    files = dict(snap.files)
    files.update({p.path: p.after for p in result.plans if p.path in result.written})
    return dataclasses.replace(snap, files=files, manifest=result.manifest, manifest_sha256=None)


def apply(transport: Transport, snap: Snapshot, chosen: tuple[Patch, ...], dry_run: bool = False,
          plans: list[FilePlan] | None = None, adopt: bool = False) -> CommitResult:
    """Apply the chosen patches all-or-nothing (one ``commit`` exchange, none if nothing changes).

    ``plans``: ``plan(snap, chosen)`` computed earlier (the Ansible collection's plan cache).
    ``adopt``: a file modified after patching (updated upstream) becomes the new pristine
    copy and is patched afresh, so ``revert`` gives the newer source back.
    Raises ``UserError`` on refusal, on a file modified after patching (unless ``adopt``),
    or when the agent cannot write; in every such case no file changed.
    """
    plans = plan(snap, chosen, adopting=adopt) if plans is None else plans
    refused = refusals(plans)
    if refused:
        raise UserError(refused[0])
    changed = [p for p in plans if p.changed]
    if not adopt:
        _guard_modified(snap, [p.path for p in changed])
    # --adopt on a modified file that needs no patch: it becomes the new pristine file as
    # it is (no record left; the copy of the old one goes, at the user's word).
    adopted = sorted(p.path for p in plans if adopt and not p.changed and snap.file_state(p.path) == "modified")
    if dry_run or not (changed or adopted):
        return CommitResult([], plans)
    files = dict((snap.manifest or {}).get("files", {}))
    for path in adopted:
        files.pop(path, None)
    pristine: dict[str, str] = {}
    for p in changed:
        keep = snap.recorded(p.path)
        original = snap.pristine.get(p.path) if keep else p.before
        if original is None:
            raise UserError(f"{snap.state_dir}: pristine copy of {p.path} is missing; reinstall speculators")
        pristine[p.path] = base64.b64encode(original).decode()
        keep.update({o.patch.id: o.patch.version for o in p.outcomes if o.state == "pending"})
        files[p.path] = {"pristine_sha256": sha256(original), "patched_sha256": sha256(p.after), "patches": keep}
        checked = fast_path.record(p.path, p.after, written_for(snap.speculators_version, all_patches()),
                                   snap.python_version)
        if checked is not None:  # what later read-only runs answer from (patcher.fast_path)
            files[p.path]["checked"] = checked
    fresh = {o.patch.id: o.patch for p in changed for o in p.outcomes if o.state == "pending"}
    result = _commit(transport, snap, changed, pristine, _manifest(snap, files, fresh), plans,
                     **({"adopted": adopted} if adopted else {}))
    result.adopted = adopted
    return result


def _commit(transport: Transport, snap: Snapshot, changed: list[FilePlan], pristine: dict[str, str],
            manifest: dict | None, plans: list[FilePlan], **extra: object) -> CommitResult:
    """One ``commit`` exchange: the agent checks that each file and the manifest are still
    what ``snap`` read (else ``changed-since-read``), so concurrent runs never lose an update."""
    answer = transport.request(
        "commit",
        state_dir=snap.state_dir,
        root=snap.speculators_root,
        writes={p.path: {"expect_sha256": sha256(p.before), "sha256": sha256(p.after),
                         "data": base64.b64encode(p.after).decode()} for p in changed},
        pristine=pristine,
        manifest=manifest,
        manifest_expect_sha256=snap.manifest_sha256,
        **extra,
    )
    return CommitResult(answer["written"], plans, answer["recovered"], manifest, committed=True)


def _manifest(snap: Snapshot, files: dict, fresh: dict[str, Patch] | None = None) -> dict | None:
    """The manifest to write for ``files``; user patches get a record (``user_records.KEY``):
    from their loaded source when applied now (``fresh``), else as recorded before."""
    if not files:
        return None
    manifest = {
        "tool": f"speculators-patch {patcher.__version__}",
        "speculators_version": snap.speculators_version,
        "vllm_versions": snap.vllm.version if snap.vllm else None,
        "files": files,
    }
    users = user_records.merged(snap.manifest, files, fresh or {})
    if users:
        manifest[user_records.KEY] = users
    return manifest


def revert(transport: Transport, snap: Snapshot, chosen: tuple[Patch, ...], partial: bool,
           force: bool = False, dry_run: bool = False) -> CommitResult:
    """Restore pristine bytes, or with ``partial`` re-derive each file from its pristine copy
    with the recorded patches minus the chosen ones. Raises ``UserError`` on a file modified
    after patching unless ``force``."""
    entries = (snap.manifest or {}).get("files", {})
    kept_for = (snap.manifest or {}).get("speculators_version")
    if entries and kept_for != snap.speculators_version:
        raise UserError(
            f"speculators {snap.speculators_version} is installed but the kept pristine copies are of "
            f"{kept_for}: not restoring them over another version (the reinstall already replaced the patched files)"
        )
    plans, files, fresh = [], {}, {}
    chosen_ids = {p.id for p in chosen}
    for path in sorted(entries):
        state, current = snap.file_state(path), snap.files.get(path)
        if state in ("pristine", "reinstalled") or current is None:
            continue
        if partial and not set(entries[path]["patches"]) & chosen_ids:
            files[path] = entries[path]  # none of the chosen patches is on it: left as it is, edited or not
            continue
        if state == "modified" and not force:
            raise UserError(f"{path} was modified after patching (sha256 matches neither the pristine nor the patched "
                            f"file); `revert --force` restores the copy kept before patching and discards that edit; "
                            f"`apply --adopt` keeps it as the new pristine copy instead")
        original = snap.pristine.get(path)
        if original is None or sha256(original) != entries[path]["pristine_sha256"]:
            raise UserError(f"{snap.state_dir}: the pristine copy of {path} is missing or does not match its "
                            f"recorded sha256; nothing was restored; run `speculators-patch repair`")
        keep = {pid: v for pid, v in entries[path]["patches"].items()} if partial else {}
        for patch in chosen:
            keep.pop(patch.id, None)
        kept = tuple(p for p in all_patches() if p.id in keep)
        replay = plan_file(snap, path, original, kept, {}, only_needed=False)
        if refusals([replay]):
            raise UserError(refusals([replay])[0])
        # Record what the replay really applied, not what was asked for.
        keep = {o.patch.id: o.patch.version for o in replay.outcomes if o.state == "pending"}
        fresh.update({o.patch.id: o.patch for o in replay.outcomes if o.state == "pending"})
        target = replay.after
        plans.append(FilePlan(path, current, target))
        if keep:
            files[path] = {"pristine_sha256": sha256(original), "patched_sha256": sha256(target), "patches": keep}
    changed = [p for p in plans if p.changed]
    manifest = _manifest(snap, files, fresh)
    same_record = {k: v["patches"] for k, v in files.items()} == {
        k: v["patches"] for k, v in entries.items() if snap.file_state(k) in ("patched", "modified")}
    if dry_run or (not changed and same_record):
        return CommitResult([], plans)
    return _commit(transport, snap, changed, {}, manifest, plans)


@dataclass
class RepairResult:
    """What ``repair`` did: ``lines``, one per file; ``unrestorable``: files of the install
    that differ from pip's RECORD with neither a record nor a kept copy (edited outside
    this tool, or a copy lost to an earlier version of it): no command here can restore
    them, reinstalling speculators does."""

    snap: Snapshot
    lines: list[str]
    unrestorable: list[str]


def repair(transport: Transport, site_packages: str | None) -> RepairResult:
    """Rebuild a consistent state from what is on disk, changing no speculators file except
    to finish rolling back an interrupted commit where the files allow it.

    Per file: the installed bytes equal to a verified pristine copy (or to pip's RECORD) ->
    no record; equal to what the manifest records as patched, with that record's verified
    copy -> that record, kept (a user patch whose source is not at hand included); equal
    to a verified copy with a set of patches replayed -> that record; otherwise, with a
    verified copy, a record under which ``status`` says ``modified``. Copies nothing
    references are deleted. Every other speculators file is compared with pip's RECORD.
    Returns the snapshot read before, one line per file, and the unrestorable files.
    Raises ``UserError`` when a patched file has no verified pristine copy left (way out:
    reinstall speculators, then ``repair`` again), or when the state cannot be written.
    """
    first = read_snapshot(transport, site_packages, tolerate_damage=True)
    transport.request("repair", state_dir=first.state_dir, root=first.speculators_root)
    snap = read_snapshot(transport, site_packages, tolerate_damage=True, record_check=True)
    entries = (snap.manifest or {}).get("files", {}) if snap.manifest and isinstance(snap.manifest.get("files"), dict) else {}
    files, lines = {}, []
    paths = sorted({p.file for p in all_patches()} | set(entries) | set(snap.backups))
    kept_for = (snap.manifest or {}).get("speculators_version") if isinstance(snap.manifest, dict) else None
    if kept_for not in (None, snap.speculators_version):  # a reinstall of another version replaced the files
        lines.append(f"the record of speculators {kept_for} is dropped: {snap.speculators_version} is installed")
        paths = []
    for path in paths:
        current = snap.files.get(path)
        if current is None:
            continue
        copies = list(snap.backups.get(path, []))
        record = snap.record.get(path)
        if record is not None:  # pip's RECORD vouches for the copy (the manifest may be gone)
            copies = [c for c in copies if sha256(c) == record] or copies
        digest = sha256(current)
        if digest == record or any(digest == sha256(c) for c in copies):
            lines.append(f"{path}: pristine")
            continue
        entry = entries.get(path) if isinstance(entries.get(path), dict) else {}
        patches = entry.get("patches") if isinstance(entry.get("patches"), dict) else None
        if (entry.get("patched_sha256") == digest and patches and all(isinstance(v, int) for v in patches.values())
                and any(sha256(c) == entry.get("pristine_sha256") for c in snap.backups.get(path, []))):
            files[path] = dict(entry)  # the record it has still describes the file and its copy
            lines.append(f"{path}: patched ({', '.join(sorted(patches))}), as recorded")
            continue
        found = None
        for copy in copies:
            for only_needed in (True, False):
                try:
                    replay = plan_file(snap, path, copy, tuple(all_patches()), {}, only_needed=only_needed) \
                        if snap.vllm is not None or not only_needed else None
                except UserError:
                    replay = None
                if replay is not None and replay.after == current:
                    found = (copy, {o.patch.id: o.patch.version for o in replay.outcomes if o.state == "pending"})
                    break
            if found:
                break
        if found:
            files[path] = {"pristine_sha256": sha256(found[0]), "patched_sha256": digest, "patches": found[1]}
            lines.append(f"{path}: patched ({', '.join(sorted(found[1]))})")
        elif copies:
            entry = entries.get(path) if isinstance(entries.get(path), dict) else {}
            kept = next((c for c in copies if sha256(c) == entry.get("pristine_sha256")), copies[0])
            files[path] = {"pristine_sha256": sha256(kept), "patched_sha256": entry.get("patched_sha256") or sha256(kept),
                           "patches": dict(entry.get("patches") or {})}
            if not all(isinstance(v, int) for v in files[path]["patches"].values()):
                files[path]["patches"] = {}
            if files[path]["patched_sha256"] == digest:
                files[path]["patched_sha256"] = sha256(kept)
            lines.append(f"{path}: modified after patching (revert --force restores the kept pristine copy)")
        elif path in entries:
            raise UserError(f"cannot repair {path}: it is not the pristine file and no verified pristine copy is left; "
                            f"reinstall speculators (pip install --force-reinstall --no-deps "
                            f"speculators=={snap.speculators_version}), then run `speculators-patch repair` again")
    pristine = {p: base64.b64encode(next(c for c in snap.backups[p] if sha256(c) == e["pristine_sha256"])).decode()
                for p, e in files.items()}
    recorded_before = user_records.records(snap.manifest)
    loaded = {p.id: p for p in all_patches() if p.origin in ("file", "package") and p.id not in recorded_before}
    manifest = _manifest(snap, files, loaded)
    transport.request("commit", state_dir=snap.state_dir, root=snap.speculators_root, writes={}, pristine=pristine,
                      manifest=manifest, manifest_expect_sha256=snap.manifest_sha256, repair=True)
    unrestorable = [p for p in (snap.record_differs or []) if p not in files]
    for path in unrestorable:
        lines.append(f"{path}: differs from what pip installed (its RECORD) and no record or pristine copy "
                     f"covers it: nothing here can restore it (edited outside speculators-patch, or its copy was "
                     f"lost); pip install --force-reinstall --no-deps speculators=={snap.speculators_version} does")
    return RepairResult(first, lines, unrestorable)

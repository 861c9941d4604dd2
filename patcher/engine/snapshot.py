"""What one ``inspect`` exchange reads from a target, and the checks made on it alone.

``read_snapshot`` asks the agent for the files the patches name (contents the controller
cache already holds are named by digest, not sent again); ``Snapshot`` holds them, with the
manifest and the kept pristine copies; ``check_supported``/``check_covered`` refuse a target
no patch here is written for. vLLM evidence (the probes' reading of the fact modules) is
cached by the digests of the files it is read from (``patcher.cache``).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from functools import cached_property

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

import patcher
from patcher import cache
from patcher.connect.transport import Transport
from patcher.digest import tool as tool_digest
from patcher.errors import Unsupported, UserError
from patcher.fixes.library_source import Evidence, LibrarySource
from patcher.fixes.manifest import REPAIR_HINT, FileRecord, Manifest
from patcher.fixes.patch import Patch, needs_vllm
from patcher.fixes.registry import PatchSet, loaded, shipped_patches, written_for
from patcher.states import FileState
from patcher.ways import Way

EVIDENCE = "vllm-evidence"


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
        "libraries": {
            k: _content(v, held) for lib in (answer.get("libraries") or {}).values() for k, v in lib["files"].items()
        },
        "pristine": {k: _content(v, held) for k, v in answer["pristine"].items()},
        "backups": {k: [_content(d, held) for d in v] for k, v in answer.get("backups", {}).items()},
    }
    return contents, held


@dataclass
class Snapshot:
    """Everything read from a target in one ``inspect`` exchange.

    ``files`` and ``pristine`` map speculators paths (``speculators/...py``, relative to its
    import root) to bytes; ``libraries`` holds the files the patches' facts read: vLLM's,
    transformers' and torch's (its ``version`` vLLM's), or where no vLLM is installed
    (``vllm_root`` None: a training-only env) transformers' and torch's alone.
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
    libraries: LibrarySource
    vllm_root: str | None  # None: no vLLM installed
    manifest: Manifest | None  # parsed once from the agent's answer (``patcher.fixes.manifest``)
    pristine: dict[str, bytes | None]
    journal_pending: bool
    patches: PatchSet  # this run's patches, with stand-ins for the user patches this target records
    recovered: bool = False
    manifest_sha256: str | None = None
    state_problem: str | None = None
    backups: dict[str, list[bytes]] = field(default_factory=dict)
    mismatched_copies: list[str] = field(default_factory=list)  # names under pristine/ not their digest's bytes
    record: dict[str, str] = field(default_factory=dict)
    dist_info: str | None = None
    record_differs: list[str] | None = None  # asked by repair: files differing from pip's RECORD
    unfinished: str | None = None  # a finished commit's cleanup that could not be completed (one line)
    state_exists: bool = False  # the state directory is there (perhaps only a lock an earlier run left)
    installer: str | None = None  # what installed speculators: its dist-info's INSTALLER (pip, uv...)
    raced: bool = False  # read again: another run changed the install between this run's read and commit

    @property
    def installer_name(self) -> str:
        """What installed speculators, for a message: the dist-info's INSTALLER (``pip``), or
        ``the installer`` when it names none."""
        return self.installer or "the installer"

    @property
    def replaced_from(self) -> str | None:
        """The speculators release the manifest was written for when another one is installed
        now (an installer replaced the package since it was patched: the record and pristine
        copies describe files that are gone), else None."""
        kept_for = self.manifest.speculators_version if self.manifest is not None else None
        if not self.recorded_paths() or kept_for in (None, self.speculators_version) or self.version_edited:
            return None
        return kept_for

    @property
    def version_edited(self) -> bool:
        """The manifest names another speculators release than the installed one, yet each
        recorded file's pristine copy is the installed release's own file (its digest is the
        one pip's ``RECORD`` lists): nothing replaced the package, the record was edited."""
        kept_for = self.manifest.speculators_version if self.manifest is not None else None
        paths = self.recorded_paths()
        if not paths or kept_for in (None, self.speculators_version):
            return False
        return all(self.record.get(p) == self.manifest.files[p].pristine_sha256 for p in paths)

    def reinstalled_paths(self) -> list[str]:
        """The recorded files that are again what the installer put there (``file_state``
        ``reinstalled``), sorted."""
        return sorted(p for p in self.recorded_paths() if self.file_state(p) == FileState.REINSTALLED)

    @property
    def installer_did(self) -> str | None:
        """What the installer did to files this tool patched, in one clause (None: nothing):
        it replaced speculators by another release (``replaced_from``), or it put back the
        files of this one (``pip install --force-reinstall``) over some patched files."""
        if self.replaced_from:
            return (
                f"{self.installer_name} replaced speculators {self.replaced_from} by {self.speculators_version} "
                f"after speculators-patch patched it: the record and pristine copies in {self.state_dir} are of "
                f"{self.replaced_from}"
            )
        back = self.reinstalled_paths()
        if not back:
            return None
        return (
            f"{self.installer_name} reinstalled speculators {self.speculators_version} over {len(back)} of the "
            f"{len(self.recorded_paths())} file(s) speculators-patch patched: they are as it installed them again"
        )

    @property
    def training_only(self) -> bool:
        """speculators without vLLM (an env that only trains): the patches of the training
        half are judged and applied; the data-generation half (``needs_vllm``) is not checked."""
        return self.vllm_root is None

    @property
    def vllm_version(self) -> str | None:
        """The installed vLLM's version (``"0.16.0"``; several dist-infos joined by ``", "``),
        or None where none is installed."""
        return None if self.training_only else self.libraries.version

    def judged(self, patches: tuple[Patch, ...]) -> tuple[Patch, ...]:
        """Those of ``patches`` this target can judge: all of them, or without vLLM those
        that do not need it (``patcher.fixes.patch.needs_vllm``)."""
        return tuple(p for p in patches if not (self.training_only and needs_vllm(p)))

    @property
    def not_checked(self) -> str | None:
        """What no verb can check here, in one line (None where vLLM is installed): without
        vLLM the data-generation half, named with the patches written for it."""
        if not self.training_only:
            return None
        ids = [p.id for p in self.patches.written_for(self.speculators_version) if needs_vllm(p)]
        which = f" ({id_ranges(ids)} rewrite speculators/data_generation/, which imports vLLM)" if ids else ""
        return f"data generation not checked: no vLLM installed in {self.site_packages}{which}"

    @cached_property
    def evidence(self) -> dict[tuple[str, str], Evidence]:
        """Evidence per (patch id, fact symbol), each probe run once (or read from the cache
        of evidence for these very vLLM files: ``cached_evidence``)."""
        source = self.libraries
        wanted = [(p, f) for p in self.judged(self.patches.patches) for f in p.facts]
        return cached_evidence(
            source.files,
            lambda: {(p.id, f.symbol): self._probe(f, source) for p, f in wanted},
            {(p.id, f.symbol) for p, f in wanted},
        )

    def _probe(self, fact, source) -> Evidence:
        """``fact.probe(source)``; without vLLM a fact about the serving vLLM
        (``Fact.of_serving``) holds, as on every release from its first, and says so."""
        if self.training_only and fact.of_serving:
            return Evidence(
                True,
                fact.modules[0],
                None,
                f"no vLLM installed here: {fact.summary}, on every vLLM release from {fact.first_release} "
                "(the one that will serve the draft)",
            )
        return fact.probe(source)

    @property
    def applicable(self) -> tuple[Patch, ...]:
        """The patches of ``patches`` written for this target's speculators version that it
        can judge (``judged``: without vLLM, the training half's)."""
        return self.judged(self.patches.written_for(self.speculators_version))

    def edited_without(self, holding: set[str]) -> list[str]:
        """The files changed by hand, never by this tool: ``edited`` (``file_state``) and not
        among ``holding``, the paths found to hold one of this tool's fixes (such a file lost
        its record instead). Sorted."""
        return sorted(p for p in self.files if self.file_state(p) == FileState.EDITED and p not in holding)

    def file_state(self, path: str) -> FileState:
        """``pristine`` | ``patched`` | ``reinstalled`` (recorded as patched, and now the bytes
        the installer put there: its pristine copy, or pip's ``RECORD`` digest, whatever
        release that is) | ``modified`` (changed after patching) | ``edited`` (no valid record
        here, and not the bytes pip installed: its ``RECORD`` digest differs; never called
        pristine). A record of another speculators release (``replaced_from``) describes no
        file here: each is ``reinstalled`` or ``edited`` against pip's ``RECORD``."""
        entry = self.entry(path)
        current = self.files.get(path)
        installed = self.record.get(path)
        if entry is None or current is None or self.replaced_from:
            if current is not None and installed is not None and sha256(current) != installed:
                return FileState.EDITED
            return FileState.REINSTALLED if entry is not None and current is not None else FileState.PRISTINE
        digest = sha256(current)
        if digest == entry.patched_sha256:
            return FileState.PATCHED
        if digest in (entry.pristine_sha256, installed):
            return FileState.REINSTALLED
        return FileState.MODIFIED

    def entry(self, path: str) -> FileRecord | None:
        """The manifest's record of ``path``, or None (no manifest, or no record of it)."""
        return None if self.manifest is None else self.manifest.files.get(path)

    def recorded_paths(self) -> list[str]:
        """The paths the manifest has a record for, in its order ([] for no manifest)."""
        return [] if self.manifest is None else list(self.manifest.files)

    def recorded(self, path: str) -> dict[str, int]:
        """Patches the manifest records as applied by us to ``path`` (id -> version)."""
        if self.file_state(path) != FileState.PATCHED:
            return {}
        return self.manifest.patches_of(path)

    def version_changes(self) -> list[dict]:
        """This tool's own patches (shipped) the record says were applied at another version than
        this speculators-patch has, an earlier or a later one: {"id", "file", "recorded_version",
        "version"} each. Their codemods find the earlier fix in place and call it satisfied, so
        only the record tells; the way out is ``revert --only ID``, then ``apply``."""
        out = []
        for patch in self.patches.patches:
            was = self.recorded(patch.file).get(patch.id) if patch.origin == "shipped" else None
            if was is not None and was != patch.version:
                out.append({"id": patch.id, "file": patch.file, "recorded_version": was, "version": patch.version})
        return out

    def applied_ids(self) -> set[str]:
        """Every patch the manifest records as applied by us, in any file."""
        return {pid for path in self.recorded_paths() for pid in self.recorded(path)}


def read_snapshot(
    transport: Transport, patches: PatchSet | None = None, tolerate_damage: bool = False, record_check: bool = False
) -> Snapshot:
    """One ``inspect`` exchange. The files read are those ``patches`` (this run's; None: the
    shipped patches and installed packs, ``registry.loaded()``) name and every file the
    target's state names (a user patch on any file, applied earlier, is read without its
    source). ``Snapshot.patches`` is ``patches`` with stand-ins for the user patches the
    target's manifest records (``PatchSet.with_recorded``; none when its state is damaged).
    ``record_check`` (``repair``): also list the speculators files whose bytes differ from
    pip's RECORD (``Snapshot.record_differs``). The manifest is parsed here, once
    (``read_manifest``: strict, or tolerant with ``tolerate_damage``). Raises ``UserError``
    when the target has no speculators, or (unless ``tolerate_damage``: ``repair``) when its
    state is inconsistent or its manifest malformed: one line naming the file at fault and
    the way out; and, ``repair`` too, when a file (not a folder) holds the state folder's path."""
    run_patches = loaded() if patches is None else patches
    patches_named = run_patches.patches
    fact_files = {m for p in patches_named for f in p.facts for m in f.modules}
    request = dict(
        speculators_files=sorted({p.file for p in patches_named}),
        vllm_files=sorted(m for m in fact_files if m.startswith("vllm/")),
        library_files=sorted(m for m in fact_files if not m.startswith("vllm/")),
    )
    if record_check:
        request["record_check"] = True
    answer, contents = _inspect(transport, request)
    if answer.get("state_blocked"):  # something else holds the state folder's path: never written past
        raise UserError(answer["state_blocked"])
    if answer.get("state_problem") and not tolerate_damage:
        raise UserError(answer["state_problem"])
    manifest = read_manifest(answer["manifest"], f"{answer['state_dir']}/manifest.json", tolerate_damage)
    spec, vllm = answer["speculators"], answer["vllm"]
    libraries = {
        name: (", ".join(lib["versions"]) or "unknown") if lib["root"] else None
        for name, lib in (answer.get("libraries") or {}).items()
    }
    if vllm is not None:
        sources = LibrarySource(
            {**contents["vllm"], **contents["libraries"]}, ", ".join(vllm["versions"]) or "unknown", libraries
        )
    else:  # a training-only env: the facts of the training half read transformers and torch alone
        sources = LibrarySource(contents["libraries"], "not installed", libraries)
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
        libraries=sources,
        vllm_root=None if vllm is None else vllm["root"],
        manifest=manifest,
        pristine=contents["pristine"],
        journal_pending=answer["journal_pending"],
        patches=run_patches if answer.get("state_problem") else run_patches.with_recorded(manifest),
        recovered=answer.get("recovered", False),
        manifest_sha256=answer.get("manifest_sha256"),
        state_problem=answer.get("state_problem"),
        backups=contents["backups"],
        mismatched_copies=answer.get("mismatched_copies") or [],
        record=spec.get("record") or {},
        dist_info=spec.get("dist_info"),
        installer=spec.get("installer"),
        record_differs=answer.get("record_differs"),
        unfinished=answer.get("unfinished"),
        state_exists=bool(answer.get("state_exists")),
    )
    check_state_version(snap, repairing=tolerate_damage)
    if snap.version_edited and not tolerate_damage:
        raise UserError(
            f"{snap.state_dir}/manifest.json is damaged (it names speculators {snap.manifest.speculators_version}, "
            f"but its pristine copies are speculators {snap.speculators_version}'s own files, as pip's RECORD lists "
            f"them: the record was edited, nothing replaced the package); {REPAIR_HINT}"
        )
    return snap


def read_manifest(data: object, where: str, tolerate_damage: bool = False) -> Manifest | None:
    """The manifest of an ``inspect`` answer (``data``: as sent; None: the target has none),
    parsed once. Raises ``UserError`` (one line, the agent's words, ``where`` named) when it
    is not of the shape this tool writes, unless ``tolerate_damage`` (``repair``: what can be
    read of it is kept, ``Manifest.parse_tolerant``)."""
    if data is None:
        return None
    return Manifest.parse_tolerant(data) if tolerate_damage else Manifest.parse(data, where)


def state_written_by(snap: Snapshot) -> Version | None:
    """The speculators-patch version that wrote the target's manifest (its ``tool`` field), or None."""
    tool = snap.manifest.tool if snap.manifest is not None else None
    try:
        return Version(tool.rpartition(" ")[2]) if isinstance(tool, str) else None
    except InvalidVersion:
        return None


def unknown_patches(record: FileRecord) -> list[str]:
    """The shipped-style ids (``SPnnn``) ``record`` names that this tool does not have, or has
    only at an older version than recorded, sorted."""
    shipped = {p.id: p for p in shipped_patches()}
    return sorted(
        pid
        for pid, version in record.patches.items()
        if pid.startswith("SP") and pid[2:].isdigit() and (pid not in shipped or version > shipped[pid].version)
    )


def check_state_version(snap: Snapshot, repairing: bool = False) -> None:
    """Raise ``UserError`` (both versions named, nothing changed) when the target's state was
    written by a newer speculators-patch, or records a shipped patch (``SPnnn``) this one does
    not have or has only at an older version: what it recorded may not be what this version
    would write or could take back. A state of an older version is read as this one's (the
    next write records this version). ``repairing``: a record no release wrote (an id this
    tool and the one that wrote it both lack: an edited record) is let through, for ``repair``
    to rebuild from the files and the kept copies."""
    if snap.manifest is None:
        return
    files = snap.manifest.files
    ours, theirs = Version(patcher.__version__), state_written_by(snap)
    where = f"{snap.state_dir}/manifest.json"
    if theirs is not None and theirs > ours:
        raise UserError(
            f"{where} was written by speculators-patch {theirs}, newer than this speculators-patch {ours}; "
            f"nothing was changed; run speculators-patch {theirs} or newer on this target "
            f"(pip install 'speculators-patch>={theirs}')"
        )
    shipped = {p.id: p for p in shipped_patches()}
    for path in sorted(files):
        for pid, version in sorted(files[path].patches.items()):
            if not (pid.startswith("SP") and pid[2:].isdigit()):
                continue  # a user patch: its record says where it came from
            mine = shipped.get(pid)
            if mine is None or version > mine.version:
                has = f"has {pid} v{mine.version}" if mine else f"has no {pid}"
                said = (
                    f"{where} records {pid} v{version} on {path}, applied by speculators-patch "
                    f"{theirs or '(unknown version)'}; this speculators-patch {ours} {has}"
                )
                if theirs is not None and theirs < ours:  # a patch that release had and this one dropped
                    raise UserError(
                        f"{said}; nothing was changed; run speculators-patch {theirs} on this target "
                        f"(pip install 'speculators-patch=={theirs}'), which has it"
                    )
                if repairing:
                    continue
                raise UserError(  # no release of this version wrote it: an edited record, or another build
                    f"{said}: the record names a patch this tool does not have (edited, or written by another "
                    f"build); nothing was changed; `{Way('repair')}` rebuilds the record from the files "
                    f"and the kept pristine copies, or run the build that applied it"
                )


def check_supported(snap: Snapshot) -> None:
    """Raise ``UserError`` unless the target has a speculators some patch is written for. An
    env without vLLM is supported: it gets the training half (``Snapshot.training_only``)."""
    version = snap.speculators_version
    if version is None:
        where = f"{snap.dist_info}/METADATA" if snap.dist_info else f"{snap.speculators_root} (no dist-info found)"
        raise UserError(
            f"cannot tell which speculators is installed: {where} has no version; "
            f"reinstall it with pip (pip install --force-reinstall --no-deps speculators==0.3.0)"
        )
    if not written_for(version, shipped_patches()):
        from patcher.fixes.support import releases_for

        written = releases_for(sorted({p.speculators for p in shipped_patches()}))
        raise Unsupported(
            f"speculators {version} is not supported: speculators-patch has no patches for it "
            f"(patches exist for speculators {', '.join(written)}); nothing was changed"
        )


def check_covered(snap: Snapshot) -> None:
    """Raise ``UserError`` (one line: what breaks, the vLLM evidence, the patch that covers it
    for another speculators) when the installed vLLM has a change a shipped patch lists in its
    ``uncovered`` (``Uncovered``) for the installed speculators. Nothing to check without vLLM."""
    if snap.training_only:
        return
    version = Version(snap.speculators_version)
    for patch in shipped_patches():
        for uncovered in patch.checks.uncovered:
            evidence = snap.evidence[(patch.id, uncovered.symbol)]
            if version in SpecifierSet(uncovered.speculators) and evidence.holds:
                raise Unsupported(
                    f"speculators {snap.speculators_version} on vLLM {snap.vllm_version}: {uncovered.what} "
                    f"({evidence.where}); no patch for speculators {snap.speculators_version} covers it "
                    f"({patch.id} is written for speculators {patch.speculators}); nothing was changed"
                )


def cached_evidence(files: dict[str, bytes | None], compute, keys: set[tuple[str, str]]) -> dict:
    """``compute()`` (evidence per (patch id, fact symbol)), cached by the digests of the
    vLLM fact modules it reads and the tool's code. A cached entry is used only when it has
    exactly ``keys``, each well formed; anything else (a damaged or hand-edited file) is
    computed afresh and stored over it."""
    digest = tool_digest()
    if digest is None or not cache.enabled():
        return compute()
    key = cache.key(
        {
            "tool": digest,
            "files": {p: None if d is None else hashlib.sha256(d).hexdigest() for p, d in sorted(files.items())},
        }
    )
    with cache.locked(EVIDENCE, key):
        stored = cache.load(EVIDENCE, key)
        if isinstance(stored, list):
            try:
                found = {(pid, symbol): Evidence(*fields) for pid, symbol, fields in stored}
                if set(found) == keys:
                    return found
            except (TypeError, ValueError):
                pass
        found = compute()
        cache.store(
            EVIDENCE,
            key,
            [[pid, symbol, [e.holds, e.file, e.line, e.found, e.missing]] for (pid, symbol), e in found.items()],
        )
        return found


def id_ranges(ids: list[str]) -> str:
    """Patch ids, each run of consecutive numbers as one range (``first-last``); others as they are."""
    numbered = sorted(int(i[2:]) for i in ids if i.startswith("SP") and i[2:].isdigit())
    runs: list[list[int]] = []
    for n in numbered:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    shown = [f"SP{r[0]:03d}" + (f"-SP{r[-1]:03d}" if len(r) > 1 else "") for r in runs]
    return ", ".join(shown + sorted(i for i in ids if not (i.startswith("SP") and i[2:].isdigit())))

"""The checks of ``verify`` that come with it (``patcher.checks.checklist`` lists them): the
library facts and patch verdicts, the calls, the generator's imports, the model runner, user
patches whose source changed, files modified after patching, and the engine proof. Each is a
``check.Check``; what they print is rich markup."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from patcher.checks.check import NO_PROOF, Check, Found, InstallCheck
from patcher.states import FileState
from patcher.ways import Way

if TYPE_CHECKING:
    from rich.console import Console

    from patcher.engine import Snapshot


def escape(text: str) -> str:
    """rich markup escaped (``rich.markup.escape``, imported on first use)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def mark_edited(changes: list[dict], rows: list[dict], key: str) -> None:
    """In ``status``/``verify`` rows: a user patch in ``changes`` (its source changed since it
    was applied) is still applied (from its earlier source), not "refused"; ``key`` (state or
    verdict) says its source changed."""
    edited = {c["id"]: c for c in changes}
    for row in rows:
        if row["id"] in edited:
            row[key] = "source-changed"
            row["detail" if key == "state" else "hint"] = (
                f"applied from its earlier source; {edited[row['id']]['source']} changed since: "
                f"'revert --only {row['id']}', then apply the new one"
            )


def mark_other_versions(changes: list[dict], rows: list[dict], key: str) -> None:
    """In ``status``/``verify`` rows: a patch of this tool applied at another version of it
    (``Snapshot.version_changes``) holds that version's fix, not this one's; ``key`` (state or
    verdict) says ``other-version``, its detail (or hint) the way out."""
    changed = {c["id"]: c for c in changes}
    for row in rows:
        c = changed.get(row["id"])
        if c:
            row[key] = "other-version"
            row["detail" if key == "state" else "hint"] = (
                f"applied at version {c['recorded_version']}, this tool has {c['version']}: "
                f"`{Way('revert', ('--only', c['id']))}`, then `{Way('apply')}`"
            )


@dataclass
class Verdicts:
    """The facts of the counted patches, their rows (id, needed, state, verdict, fix hint) and
    every patch's row (``all_rows``, counted or not)."""

    facts: list
    rows: list[dict]
    all_rows: list[dict]

    @property
    def ok(self) -> bool:
        return not any(r["verdict"] not in ("ok", "source-changed", "other-version") for r in self.rows)


LIBRARY_NAMES = {"vllm": "vLLM"}  # how the facts' title names a library (others: as imported)


def facts_title(snap: Snapshot, facts: list) -> str:
    """The facts table's title: each library the facts read, with its installed version
    (``facts (static read of ...): vLLM 0.34.0, transformers 5.22.2``)."""
    if snap.training_only:  # training only: the facts read transformers (and torch) alone
        libraries = dict.fromkeys(f.fact.library for f in facts if f.fact.library != "vllm")  # the serving vLLM's
        read = ", ".join(f"{lib} {snap.libraries.version_of(lib)}" for lib in libraries) or "none"
        return f"facts (static read of {snap.site_packages}): {read}; vLLM not installed"
    libraries = dict.fromkeys(["vllm", *(f.fact.library for f in facts)])
    read = ", ".join(f"{LIBRARY_NAMES.get(lib, lib)} {snap.libraries.version_of(lib)}" for lib in libraries)
    return f"facts (static read of {snap.vllm_root}): {read}"


class PatchVerdicts(Check):
    """Each fact a patch relies on, with its evidence; each patch's verdict."""

    key = "verdicts"
    failing = "the patch verdicts (fix column)"

    def judge(self, found: Found) -> Verdicts:
        rows = [
            {"id": c.patch.id, "needed": c.needed, "state": c.state, "verdict": c.verdict, "hint": c.hint}
            for c in found.every
            if c.patch.id in found.ids
        ]
        mark_edited(SOURCES.judge(found), rows, "verdict")
        mark_other_versions(VERSIONS.judge(found), rows, "verdict")
        every = [{"id": c.patch.id, "needed": c.needed, "state": c.state, "verdict": c.verdict} for c in found.every]
        return Verdicts([f for f in found.facts if f.patch.id in found.ids], rows, every)

    def as_json(self, part: Verdicts, snap: Snapshot) -> dict:
        source = snap.libraries
        facts = [
            {
                "patch": f.patch.id,
                "library": f.fact.library,
                "library_version": source.version_of(f.fact.library),
                "symbol": f.fact.symbol,
                "summary": f.fact.summary,
                "holds": f.evidence.holds,
                "missing": f.evidence.missing,
                "file": f.evidence.file,
                "line": f.evidence.line,
                "found": f.evidence.found,
                "first_release": f.fact.first_release,
            }
            for f in part.facts
        ]
        return {"facts": facts, "patches": part.rows}

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        from rich.table import Table

        table = Table(title=facts_title(snap, install.facts), title_justify="left")
        for col in ("patch", "symbol", "holds", "evidence", "found"):
            table.add_column(col, overflow="fold", no_wrap=col in ("patch", "evidence"))
        for f in sorted(install.facts, key=lambda f: f.patch.id):
            mark = "[red]missing[/]" if f.evidence.missing else "[green]yes[/]" if f.evidence.holds else "[dim]no[/]"
            table.add_row(f.patch.id, escape(f.fact.symbol), mark, escape(f.evidence.where), escape(f.evidence.found))
        console.print(table)
        console.print(f"speculators {snap.speculators_version} patches (installed at {snap.speculators_root})")
        table = Table()
        for col in ("patch", "needed", "state", "verdict", "fix"):
            table.add_column(col, overflow="fold")
        for r in sorted(install.rows, key=lambda r: r["id"]):
            color = "green" if r["verdict"] == "ok" else "red"
            needed = "?" if r["needed"] is None else "yes" if r["needed"] else "no"
            table.add_row(r["id"], needed, r["state"], f"[{color}]{r['verdict']}[/]", escape(r["hint"]))
        console.print(table)


class Calls(Check):
    """Every call from speculators into vLLM, and from its training half into transformers and
    torch (``patcher.checks.callsite``, ``library_calls``), and with ``--runtime`` the same
    calls on the live objects."""

    key = "calls"
    failing = "the calls"

    def ask(self, snap: Snapshot) -> dict:
        from patcher.checks import callsite

        return {
            "symbols": [list(callsite.WORKER), ["vllm.config.vllm", "VllmConfig"]],
            "follow_attributes": True,
        }

    def judge(self, found: Found) -> Any:  # checks.verify.CallsCheck
        return found.calls

    def as_json(self, part: Any, snap: Snapshot) -> dict:
        return {
            "calls": {
                "ok": part.ok,
                "checked": len(part.checked) + (len(part.library.checked) if part.library else 0),
                "findings": [f.as_dict() for f in part.all_findings],
                "libraries": _libraries(part, snap),
                "runtime": part.runtime.as_dict() if part.runtime else None,
            }
        }

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        calls = install.calls
        names = [f"vLLM {snap.vllm_version}"] if not snap.training_only else []  # training only: no vLLM to call
        checked, missing = len(calls.checked), []
        if calls.library is not None:
            for lib, version in calls.library.versions.items():
                if version is None:
                    missing.append(lib)
                else:
                    names.append(f"{lib} {version}")
            checked += len(calls.library.checked)
        absent = f"; {' and '.join(missing)} not installed, not checked" if missing else ""
        title = f"calls from speculators into {', '.join(names)} ({checked} checked, static{absent})"
        findings = calls.all_findings
        errors = sum(f.severity == "error" for f in findings)
        if not findings:
            console.print(f"{title}: every call fits")
        else:
            console.print(f"{title}: {errors} break(s), {len(findings) - errors} note(s)")
        for f in findings:
            mark = "[red]break[/]" if f.severity == "error" else "[dim]note[/]"
            console.print(f"  {mark} {escape(f'{f.where}: {f.call}: {f.detail}')}")
            console.print(f"        {f.library} {escape(f'{f.vllm_where}: {f.vllm_found}')}")
        if calls.runtime is not None:
            rt = calls.runtime
            console.print(
                f"runtime reading (vLLM {rt.vllm_version} imported by the target, {rt.wall_seconds:.1f} s): "
                f"{len(rt.findings)} finding(s), "
                + (
                    "[green]agrees with the static reading[/]"
                    if not rt.disagreements
                    else f"[red]{len(rt.disagreements)} disagreement(s) with the static reading[/]"
                )
            )
            for line in rt.disagreements:
                console.print(f"  {escape(line)}")


def _libraries(calls: Any, snap: Snapshot) -> dict:
    """Per library the calls check read (vLLM; transformers and torch, the training half's):
    its version (None: not installed, nothing checked), calls and imports checked, breaks, notes."""
    out = {}
    versions = {"vLLM": snap.vllm_version}
    versions.update(calls.library.versions if calls.library else {})
    for lib, version in versions.items():
        findings = [f for f in calls.all_findings if f.library == lib]
        out[lib] = {
            "version": version,
            "checked": len(calls.checked) if lib == "vLLM" else calls.library.count(lib),
            "breaks": sum(f.severity == "error" for f in findings),
            "notes": sum(f.severity != "error" for f in findings),
        }
    return out


# What the static import check cannot see (patcher.checks.import_path, torch_builds): said where it
# finds nothing, so "resolves" is never read as "imports" (issue 46).
UNSEEN = (
    "as read; not seen: what runs at import, e.g. compiled operators and pydantic rebuilding "
    "speculators' config models; `selftest` imports them"
)


class Imports(Check):
    """What importing the generator and training's entry points runs (``patcher.checks.import_path``),
    read in the same exchange."""

    key = "imports"
    failing = "the imports"

    def ask(self, snap: Snapshot) -> dict:
        from patcher.checks import import_path, torch_builds

        return {"import_path": import_path.request(), "builds": torch_builds.request()}

    def judge(self, found: Found) -> Any:
        return found.calls.imports

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        imports = install.parts.get(self.key)
        if imports is None:
            return
        errors = sum(f.severity == "error" for f in imports.findings)
        title = (
            f"imports on the import paths of the generator and of training ({len(imports.modules)} speculators "
            f"modules, {imports.checked} imports resolved, static)"
        )
        console.print(
            f"{title}: "
            + (
                f"every import resolves ({UNSEEN})"
                if not imports.findings
                else f"{errors} break(s), {len(imports.findings) - errors} note(s)"
            )
        )
        for f in imports.findings:
            mark = "[red]break[/]" if f.severity == "error" else "[dim]note[/]"
            console.print(f"  {mark} {escape(f'{f.where}: {f.statement}: {f.detail}')}")


class ModelRunner(Check):
    """Which model runner vLLM's GPU worker builds (``patcher.checks.model_runner``)."""

    key = "model_runner"
    failing = "the model runner"

    @property
    def reads(self) -> tuple[str, ...]:  # type: ignore[override]
        from patcher.checks import model_runner

        return (model_runner.WORKER, model_runner.CONFIG)

    def ask(self, snap: Snapshot) -> dict:
        from patcher.checks import model_runner

        return {"env": [model_runner.VARIABLE]}

    def judge(self, found: Found) -> Any:
        return found.calls.runner

    def ok(self, part: Any) -> bool:
        return part is None or part.severity != "error"

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        runner = install.parts.get(self.key)
        if runner is not None:
            mark = {"error": "[red]break[/]", "warning": "[yellow]warning[/]"}.get(runner.severity, "[dim]note[/]")
            console.print(f"model runner: {mark} {escape(runner.message)}")
            console.print(f"        vLLM {escape(f'{runner.where}: {runner.found}')}")


class Listing(Check):
    """A check whose part is the list of what fails it: ``ok`` when empty, its JSON the list
    itself, its lines the same under a failed ``apply`` as in ``verify``."""

    def ok(self, part: list) -> bool:
        return not part

    def as_json(self, part: list, snap: Snapshot) -> dict:
        return {self.key: part}

    def render_failed(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        self.render(console, install, snap)


class UserPatchSources(Listing):
    """User patches applied from a file that changed since (``fixes.userpatches.record``)."""

    key = "user_patch_sources_changed"
    failing = "a user patch's source"

    def judge(self, found: Found) -> list[dict]:
        from patcher.fixes.userpatches import record

        snap = found.snap
        changes = record.source_changes(snap.manifest, snap.patches.user_patches(), snap.applied_ids())
        return [c for c in changes if c["id"] in found.ids]

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        for c in install.changed_sources:
            console.print(
                f"[red]{c['id']}: its source changed since it was applied[/] ({escape(c['source'])}: sha256 "
                f"{c['sha256'][:12]}..., {c['recorded_sha256'][:12]}... when applied); the install has the old "
                f"fix: `{Way('revert', ('--only', c['id']))}`, then `{Way('apply')}` with the new file",
                soft_wrap=True,
            )


class PatchVersions(Listing):
    """This tool's patches applied at another version of them (``Snapshot.version_changes``)."""

    key = "patches_at_other_versions"
    failing = "a patch applied at another version"

    def judge(self, found: Found) -> list[dict]:
        return [c for c in found.snap.version_changes() if c["id"] in found.ids]

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        for c in install.parts[self.key]:
            console.print(
                f"[red]{c['id']}: applied at version {c['recorded_version']}[/], this speculators-patch has "
                f"version {c['version']}; the install has that version's fix: "
                f"`{Way('revert', ('--only', c['id']))}`, then `{Way('apply')}`",
                soft_wrap=True,
            )


class ModifiedFiles(Listing):
    """Files whose bytes are neither the pristine nor the patched ones (``Snapshot.file_state``)."""

    key = "modified_files"
    failing = "a file modified after patching"

    def judge(self, found: Found) -> list[str]:
        snap = found.snap
        return sorted(p for p in snap.recorded_paths() if snap.file_state(p) == FileState.MODIFIED)

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        for path in install.modified:
            console.print(
                f"[red]{path}: modified after patching[/] (its sha256 matches neither the pristine nor the patched "
                f"file, so the patches recorded for it are not vouched for): "
                f"`{Way('apply', ('--adopt',))}` keeps the edit (it joins the pristine copy, "
                f"which revert restores) and patches it; "
                f"`{Way('revert', ('--force',))}` restores the kept copy (the edit is lost)",
                soft_wrap=True,
            )


class EditedFiles(Listing):
    """Files this tool's patches name that differ from what pip installed (their ``RECORD``)
    with no record of this tool: changed by hand, never by this tool (``FileState.EDITED``),
    which ``status`` calls ``modified``. A file holding a fix of this tool without a record is
    not one (the state was lost: ``commands.common.refuse_lost_state`` names it), nor is a
    file of a release an installer put there since (``Snapshot.replaced_from``: pip's doing)."""

    key = "edited_files"
    failing = "a file changed by hand"

    def judge(self, found: Found) -> list[str]:
        snap = found.snap
        if snap.replaced_from:
            return []
        return snap.edited_without({c.patch.file for c in found.every if c.state == "satisfied"})

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        for path in install.parts[self.key]:
            console.print(
                f"[red]{path}: changed by hand[/], not by speculators-patch (it differs from what pip installed, "
                f"its RECORD, holds none of this tool's fixes and no record of this tool names it): left as it "
                f"is, and nothing here vouches for it; `status` calls the install modified until the edit is undone",
                soft_wrap=True,
            )


@dataclass
class Proof:
    """Why the installed vLLM's release has no engine proof (None: it has one, or no vLLM is
    installed) and where the release was proven."""

    unproven: str | None
    devices: list[str]

    @property
    def ok(self) -> bool:
        return not self.unproven


def _release(minor: tuple[int, int] | None) -> str | None:
    return None if minor is None else ".".join(map(str, minor))


class EngineProof(Check):
    """Whether the installed vLLM's release was proven on the real engine (``patcher.checks.proven``)."""

    key = "proven"
    failing = NO_PROOF

    def judge(self, found: Found) -> Proof:
        from patcher.checks import proven

        snap = found.snap
        if snap.training_only:  # no vLLM: no engine to prove
            return Proof(None, [])
        versions = snap.vllm_version.split(", ")
        return Proof(
            proven.unproven(versions, snap.speculators_version), proven.devices(versions, snap.speculators_version)
        )

    def as_json(self, part: Proof, snap: Snapshot) -> dict:
        from patcher.checks import proven

        return {
            "proven": {
                "oldest": _release(proven.oldest(snap.speculators_version)),
                "newest": _release(proven.newest(snap.speculators_version)),
                "unproven": part.unproven,
                "devices": part.devices,
                "releases": [
                    {
                        "release": p.release,
                        "archs": list(p.archs),
                        "date": p.date,
                        "by": p.by,
                        "where": p.where,
                        "speculators": p.speculators,
                    }
                    for p in proven.PROVEN
                ],
            }
        }

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        from patcher.checks import proven

        if install.unproven and not install.only_unproven:  # else the verdict line says it
            console.print(f"[red]{escape(install.unproven)}[/]")
        elif not install.unproven and not install.not_checked:  # no vLLM (training only): no engine to prove
            gpu = (
                ""
                if any(d != proven.CPU for d in install.devices)
                else ("; no GPU proof for it: 'speculators-patch selftest --device cuda' on a GPU box gives one")
            )
            console.print(f"engine proof for this vLLM release: {escape('; '.join(install.devices))}{gpu}")

    render_failed = render


VERDICTS = PatchVerdicts()
CALLS = Calls()
IMPORTS = Imports()
RUNNER = ModelRunner()
SOURCES = UserPatchSources()
VERSIONS = PatchVersions()
MODIFIED = ModifiedFiles()
EDITED = EditedFiles()
PROOF = EngineProof()

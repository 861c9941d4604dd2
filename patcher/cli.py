"""The ``speculators-patch`` command line: apply, diff, verify, status, revert, list.

Exit codes: 0 success; 1 ``diff`` found changes, ``verify`` found disagreements, ``apply``
left an install that fails verify's checks, or ``repair`` found a file nothing kept restores;
2 bad input or a refused operation (one line on stderr, nothing changed); 3 ``verify`` (and
``apply``): every static check passes, but the installed vLLM release has no engine proof
(``UNPROVEN``); 130 Ctrl-C (one line saying whether anything changed).
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import click

import patcher
from patcher.errors import Interrupted, UserError
from patcher.selftest.remote.tiny_models import ARCHS as _TINY_ARCHS

# Imported where used, not here: ``--version`` imports none of these, read-only commands
# on a patched install never import libcst, and rich is imported only to render
# (docs/speed.md).
if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from patcher import engine
    from patcher.engine import Snapshot
    from patcher.connect.transport import Transport
    from patcher.verify import CallsCheck

SELFTEST_ARCHS = tuple(_TINY_ARCHS)  # what the target side can build (as patcher.selftest.command.ARCHS)


def _console() -> Console:
    """The console for standard output. sys.stdout is None when the tool is started with
    standard output closed (``>&-``); that is refused in one line by ``_Group.main``."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout is not None and sys.stdout.isatty() else 120)


def print_out(render: Callable[[Console], None]) -> None:
    """Run ``render`` on the standard output console. Piped or redirected (no terminal), the
    text is 120 columns wide and every line loses the trailing spaces rich pads tables
    and titles with, so ``grep``, ``diff`` and logs see only what was written; on a terminal
    it prints as it renders. (What ``render`` writes to ``sys.stdout`` itself, a diff, is
    passed through untouched.)"""
    console = _console()
    if sys.stdout.isatty():
        render(console)
        return
    with console.capture() as captured:
        render(console)
    text = captured.get()
    if text:
        sys.stdout.write("\n".join(line.rstrip() for line in text.split("\n")))
        sys.stdout.flush()


def select(only: tuple[str, ...], skip: tuple[str, ...], keep: str | None = None, applied: set[str] | None = None):
    """``patcher.registry.select``, imported on first use."""
    from patcher.registry import select as chosen

    return chosen(only, skip, keep, applied)


def escape(text: str) -> str:
    """rich markup escaped (``rich.markup.escape``, imported on first use)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


@dataclass
class Report:
    """What one subcommand produced for one target: JSON data, exit code, and a renderer."""

    data: dict
    exit_code: int = 0
    render: Callable[[Console], None] = lambda console: None
    notes: list[str] = field(default_factory=list)


def connect(target: str | None, host: str | None = None, ssh_config: str | None = None) -> tuple[Transport, str | None]:
    """A transport to the target's agent and, for a bare site-packages target, its path.
    ``host`` is an SSH host, or an ``--exec`` command (``patcher.connect.exec.ExecTarget``).
    Its waits are this command's ``--connect-timeout`` and ``--timeout`` (seconds)."""
    transport, site_packages = _connect(target, host, ssh_config)
    ctx = click.get_current_context(silent=True)
    for attribute, key, variable in (("connect_timeout", "speculators_patch.connect_timeout", "SPECULATORS_PATCH_CONNECT_TIMEOUT"),
                                     ("timeout", "speculators_patch.timeout", "SPECULATORS_PATCH_TIMEOUT")):
        value = ctx.meta.get(key) if ctx else None
        if value is None and os.environ.get(variable) and not (ctx and key in ctx.meta):
            value = _seconds(os.environ[variable], variable)  # selftest: its --timeout is its own run's
        if value is not None:
            setattr(transport, attribute, float(value))
    return transport, site_packages


def _seconds(text: str, variable: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 86400:
        raise UserError(f"${variable} is {text!r}: expected seconds between 1 and 86400")
    return value


def _connect(target: str | None, host: str | None, ssh_config: str | None) -> tuple[Transport, str | None]:
    from patcher.connect.exec import ExecTarget

    if isinstance(host, ExecTarget):
        from patcher.connect.exec import exec_transport

        return exec_transport(host, target)
    if host is not None:
        from patcher.connect.ssh import DEFAULT_PERSIST, ssh_transport

        ctx = click.get_current_context(silent=True)
        persist = ctx.meta.get("speculators_patch.ssh_persist") if ctx else None
        return ssh_transport(host, target, ssh_config, DEFAULT_PERSIST if persist is None else persist)
    from patcher.connect.local import local_transport

    return local_transport(target)


def _describe(snap: Snapshot) -> dict:
    return {
        "target": snap.label,
        "python": snap.python,
        "site_packages": snap.site_packages,
        "speculators": snap.speculators_version,
        "speculators_root": snap.speculators_root,
        "editable_source": snap.editable_source,
        "vllm": snap.vllm.version if snap.vllm else None,
    }


def _notes(snap: Snapshot) -> list[str]:
    notes = []
    if snap.editable_source:
        notes.append(f"speculators is an editable install: patching the source at {snap.speculators_root}")
    if snap.recovered:
        notes.append("an interrupted commit was found and rolled back: the install is as it was before it")
    elif snap.journal_pending:
        notes.append(f"an interrupted commit left {snap.state_dir}/journal.json; it could not be rolled back "
                     "(read-only?) and will be on the next writable run")
    return notes


def _text(source: bytes) -> str:
    """Source bytes as text, in the encoding its coding cookie declares (PEP 263)."""
    import io
    import tokenize

    try:
        encoding = tokenize.detect_encoding(io.BytesIO(source).readline)[0]
        return source.decode(encoding)
    except (SyntaxError, LookupError, UnicodeError):
        return source.decode("utf-8", "replace")


def _udiff(plans: list[engine.FilePlan], root: str) -> str:
    chunks = []
    for p in plans:
        if p.changed:
            chunks += difflib.unified_diff(
                _text(p.before).splitlines(True), _text(p.after).splitlines(True),
                f"a/{p.path}", f"b/{p.path}",
            )
    return "".join(chunks)


def _outcome_rows(plans: list[engine.FilePlan]) -> list[dict]:
    from patcher.userpatches.loader import origin_fields

    return [
        {"id": o.patch.id, "name": o.patch.name, "version": o.patch.version, "file": p.path,
         "state": o.state, "detail": o.detail, **origin_fields(o.patch)}
        for p in plans for o in p.outcomes
    ]


APPLY_WORDS = {"applied-now": "applied now", "applied": "applied earlier", "satisfied": "already satisfied"}
DRY_RUN_WORDS = {"pending": "would apply", "applied": "applied earlier", "satisfied": "already satisfied"}


def _outcome_table(rows: list[dict], title: str, words: dict[str, str] | None = None) -> Table:
    from rich.table import Table

    from patcher.registry import all_patches
    from patcher.userpatches.loader import describe

    table = Table(title=title, title_justify="left")
    by_id = {p.id: p for p in all_patches()}
    users = any(by_id[r["id"]].origin != "shipped" for r in rows)  # the origin column only where it says something
    for col in ("patch", "state", "title", *(("origin",) if users else ())):
        # long origins (paths) fold rather than lose their middle, and never squeeze the ids
        table.add_column(col, no_wrap=col == "patch" and users, overflow="fold" if col == "origin" else "ellipsis")
    colors = {"pending": "yellow", "applied-now": "green", "applied": "green", "satisfied": "green", "not-needed": "dim", "refused": "red",
              "stale": "red", "fact-missing": "red", "source-changed": "red"}
    for r in sorted(rows, key=lambda r: r["id"]):
        word = (words or {}).get(r["state"], r["state"])
        if r.get("file_modified"):
            word, r = f"{word} (file modified)", {**r, "state": "refused"}  # red: not vouched for
        origin = (escape(describe(by_id[r["id"]])) if by_id[r["id"]].origin != "shipped" else "",) if users else ()
        table.add_row(f"{r['id']} v{r['version']}", f"[{colors.get(r['state'], '')}]{word}[/]", by_id[r["id"]].title, *origin)
    return table


def do_apply(transport: Transport, snap: Snapshot, chosen, dry_run: bool, adopt: bool = False) -> Report:
    """``apply``, then (unless ``dry_run``) every check ``verify`` makes on the result: when
    the install is not OK it ends with verify's one-line verdict and verify's exit code (1, or
    ``UNPROVEN`` when only the engine proof is missing; its ``sources`` request rides on the
    commit, so it costs no round trip of its own)."""
    from patcher import engine
    from patcher.verify import send_calls_ahead

    engine.check_supported(snap)
    engine.check_covered(snap)
    _refuse_edited_user_patches(snap, {p.id for p in chosen}, "apply")
    if not dry_run:
        send_calls_ahead(transport, snap)
    result = engine.apply(transport, snap, chosen, dry_run=dry_run, adopt=adopt)
    rows = _outcome_rows(result.plans)
    if result.written:  # in JSON as in text: what this run applied, not what was pending
        for row in rows:
            row["state"] = "applied-now" if row["state"] == "pending" else row["state"]
    changed = sorted({r["file"] for r in rows if r["state"] == "pending"})
    check = None if dry_run else check_install(transport, engine.after(snap, result), {p.id for p in chosen})
    modified = set(check.modified) if check else {p.path for p in result.plans if snap.file_state(p.path) == "modified"}
    for row in rows:
        if row["file"] in modified:
            row["file_modified"] = True
    data = {**_describe(snap), "dry_run": dry_run, "written": result.written, "adopted": result.adopted, "patches": rows,
            "verify": None if check is None else {"ok": check.ok, "failing": check.failing}}

    def render(console: Console) -> None:
        words = DRY_RUN_WORDS if dry_run else APPLY_WORDS
        console.print(_outcome_table(rows, f"speculators {snap.speculators_version} on vLLM {snap.vllm.version} ({snap.label})", words))
        if dry_run:
            console.print(f"dry run: {len(changed)} file(s) would change, nothing written")
        elif result.written:
            console.print(f"patched {len(result.written)} file(s) under {snap.speculators_root}: {', '.join(result.written)}")
        if result.adopted:
            console.print(f"adopted {len(result.adopted)} file(s) as they are, as their new pristine copy (every patch "
                          f"needed is already in them): {', '.join(result.adopted)}")
        elif dry_run or result.written:
            pass
        elif modified:
            console.print(f"nothing written: {', '.join(sorted(modified))} changed after patching (below)")
        else:
            console.print("nothing to do: every needed patch is already applied")
        if check is not None and not check.ok:
            _render_findings(console, check, snap, transport)
            console.print(check.line())
            console.print(f"[dim]`{escape(_again('verify', transport))}` shows the evidence[/]")

    return Report(data, 0 if check is None else check.exit_code, render)


def do_diff(transport: Transport, snap: Snapshot, chosen) -> Report:
    from patcher import engine

    engine.check_supported(snap)
    engine.check_covered(snap)
    _refuse_edited_user_patches(snap, {p.id for p in chosen}, "diff")
    plans = engine.plan(snap, chosen)
    refused = engine.refusals(plans)
    if refused:
        raise UserError(refused[0])
    engine.guard_modified(snap, [p.path for p in plans if p.changed])  # as apply would refuse
    text = _udiff(plans, snap.speculators_root)
    data = {**_describe(snap), "changed": bool(text), "diff": text, "patches": _outcome_rows(plans)}

    def render(console: Console) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    return Report(data, 1 if text else 0, render)


def do_status(transport: Transport, snap: Snapshot, chosen) -> Report:
    from patcher import engine
    from patcher.verify import STALE_FIX, recorded_states

    engine.check_supported(snap)
    plans = engine.plan(snap, chosen)
    rows = _outcome_rows(plans)
    moved = recorded_states(snap, plans)  # applied by us for another vLLM (upgraded or downgraded since)
    for r in rows:
        r["state"] = moved.get(r["id"], r["state"])
    _mark_edited(_source_changes(snap), rows, "state")
    files = {p.path: snap.file_state(p.path) for p in plans}
    data = {**_describe(snap), "files": files, "patches": rows}

    def render(console: Console) -> None:
        console.print(f"target {snap.label}: speculators {snap.speculators_version} at {snap.speculators_root}, "
                      f"vLLM {snap.vllm.version if snap.vllm else 'not installed'}")
        for path, state in files.items():
            console.print(f"  {path}: {state}")
        console.print(_outcome_table(rows, "patches"))
        if any(r["state"] == "stale" for r in rows):
            console.print(f"stale: applied for another vLLM, wrong for vLLM {snap.vllm.version}; "
                          f"fix: {escape(_with_target(STALE_FIX, transport))}")

    return Report(data, 0, render)


def _source_changes(snap: Snapshot) -> list[dict]:
    """Loaded user patches applied to ``snap`` whose source changed since they were applied."""
    from patcher.registry import user_patches
    from patcher.userpatches import record

    return record.source_changes(snap.manifest, user_patches(), snap.applied_ids())


def _refuse_edited_user_patches(snap: Snapshot, ids: set[str], what: str) -> None:
    """Raise ``UserError`` (the way out named) when ``what`` would apply one of ``ids``
    whose file changed since it was applied (``_source_changes``), whatever the version:
    the installed code is the old fix, which the new codemod would meet as unknown code."""
    for change in _source_changes(snap):
        pid = change["id"]
        if pid in ids:
            raise UserError(f"{pid} was applied from {change['recorded_source'] or 'another file'} (sha256 "
                            f"{change['recorded_sha256'][:12]}); {change['source']} now differs (sha256 "
                            f"{change['sha256'][:12]}), and {what} would apply it over the old fix: "
                            f"'revert --only {pid}' first (it needs no old file), then apply the new one")


def _mark_edited(changes: list[dict], rows: list[dict], key: str) -> None:
    """In ``status``/``verify`` rows: a user patch in ``changes`` (``_source_changes``) is
    still applied (from its earlier source), not "refused"; ``key`` (state or verdict)
    says its source changed."""
    edited = {c["id"]: c for c in changes}
    for row in rows:
        if row["id"] in edited:
            row[key] = "source-changed"
            row["detail" if key == "state" else "hint"] = (
                f"applied from its earlier source; {edited[row['id']]['source']} changed since: "
                f"'revert --only {row['id']}', then apply the new one")


@dataclass
class InstallCheck:
    """What ``verify`` checks, for one target: the vLLM facts and the patch verdicts (rows,
    narrowed by ``--only``/``--skip``), the call, import and model-runner checks, the engine
    proof (``unproven``: why there is none; ``devices``: where the release was proven), user
    patches whose source changed, and files modified after patching. ``failing`` names each
    failed part in words; ``ok`` when none failed."""

    facts: list
    rows: list[dict]
    calls: CallsCheck
    unproven: str | None
    changed_sources: list[dict]
    modified: list[str]
    failing: list[str]
    devices: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no part failed (``verify``'s exit 0)."""
        return not self.failing

    @property
    def only_unproven(self) -> bool:
        """Every static check passes; only the engine proof is missing."""
        return self.failing == [NO_PROOF]

    @property
    def exit_code(self) -> int:
        """0 OK, ``UNPROVEN`` (3) when only the engine proof is missing, else 1."""
        return 0 if self.ok else UNPROVEN if self.only_unproven else 1

    def line(self) -> str:
        """The one-line verdict ``verify`` ends with (``apply`` too, when it is not OK)."""
        if self.ok:
            return "[green]verify: OK[/]"
        if self.only_unproven:  # what is missing and how to get it
            return f"[yellow]verify: NOT PROVEN[/] (every static check passes): {escape(self.unproven)}"
        return f"[red]verify: FAILED[/] ({', '.join(self.failing)})"


NO_PROOF = "no engine proof for this vLLM"


def check_install(transport: Transport, snap: Snapshot, ids: set[str], runtime: bool = False) -> InstallCheck:
    """Every check ``verify`` makes on ``snap`` (one ``sources`` exchange, or none when it
    was sent ahead: ``verify.send_calls_ahead``). ``ids``: the patches whose verdicts count."""
    from patcher import proven
    from patcher.verify import verify, verify_calls

    facts, checks = verify(snap)
    facts, checks = [f for f in facts if f.patch.id in ids], [c for c in checks if c.patch.id in ids]
    calls = verify_calls(transport, snap, runtime)
    unproven = proven.unproven(snap.vllm.version.split(", "), snap.speculators_version)
    proof_devices = proven.devices(snap.vllm.version.split(", "), snap.speculators_version)
    changed_sources = [c for c in _source_changes(snap) if c["id"] in ids]
    rows = [{"id": c.patch.id, "needed": c.needed, "state": c.state, "verdict": c.verdict,
             "hint": _with_target(c.hint, transport)} for c in checks]
    _mark_edited(changed_sources, rows, "verdict")
    modified = sorted(p for p in (snap.manifest or {}).get("files", {}) if snap.file_state(p) == "modified")
    failing = [what for what, bad in (
        ("the patch verdicts (fix column)", any(r["verdict"] not in ("ok", "source-changed") for r in rows)),
        ("the calls", not calls.ok), ("the imports", not calls.imports_ok), ("the model runner", not calls.runner_ok),
        ("a user patch's source", bool(changed_sources)), ("a file modified after patching", bool(modified)),
        (NO_PROOF, bool(unproven))) if bad]
    return InstallCheck(facts, rows, calls, unproven, changed_sources, modified, failing, proof_devices)


def _render_findings(console: Console, check: InstallCheck, snap: Snapshot, transport: Transport) -> None:
    """What failed besides the tables: user patch sources, modified files; the proof."""
    from patcher import proven

    for c in check.changed_sources:
        console.print(f"[red]{c['id']}: its source changed since it was applied[/] ({escape(c['source'])}: sha256 "
                      f"{c['sha256'][:12]}..., {c['recorded_sha256'][:12]}... when applied); the install has the old "
                      f"fix: `revert --only {c['id']}`, then `apply` with the new file", soft_wrap=True)
    for path in check.modified:
        console.print(f"[red]{path}: modified after patching[/] (its sha256 matches neither the pristine nor the patched "
                      f"file, so the patches recorded for it are not vouched for): "
                      f"`{escape(_again('apply', transport))} --adopt` keeps it as the new pristine copy and patches it; "
                      f"`{escape(_again('revert', transport))} --force` restores the kept copy (the edit is lost)",
                      soft_wrap=True)
    if check.unproven and not check.only_unproven:  # else the verdict line says it
        console.print(f"[red]{escape(check.unproven)}[/]")
    elif not check.unproven:
        gpu = "" if any(d != proven.CPU for d in check.devices) else (
            "; no GPU proof for it: 'speculators-patch selftest --device cuda' on a GPU box gives one")
        console.print(f"engine proof for this vLLM release: {escape('; '.join(check.devices))}{gpu}")


def do_verify(transport: Transport, snap: Snapshot, chosen, runtime: bool = False) -> Report:
    """``verify``: every check of ``check_install`` with its evidence; exit 1 when one fails,
    ``UNPROVEN`` (3) when only the engine proof is missing."""
    from patcher import engine, proven

    engine.check_supported(snap)
    ids = {p.id for p in chosen}  # --only/--skip narrow the patch checks, not the call check
    check = check_install(transport, snap, ids, runtime)
    facts, rows, calls, unproven, changed_sources = check.facts, check.rows, check.calls, check.unproven, check.changed_sources
    ok = check.ok
    data = {
        **_describe(snap),
        "ok": ok,
        "facts": [{"patch": f.patch.id, "symbol": f.fact.symbol, "summary": f.fact.summary, "holds": f.evidence.holds,
                   "missing": f.evidence.missing, "file": f.evidence.file, "line": f.evidence.line,
                   "found": f.evidence.found, "first_release": f.fact.first_release} for f in facts],
        "patches": rows,
        "calls": {"ok": calls.ok, "checked": len(calls.checked), "findings": [f.as_dict() for f in calls.findings],
                  "runtime": calls.runtime.as_dict() if calls.runtime else None},
        "imports": calls.imports.as_dict() if calls.imports else None,
        "model_runner": calls.runner.as_dict() if calls.runner else None,
        "user_patch_sources_changed": changed_sources,
        "modified_files": check.modified,
        "failing": check.failing,
        "proven": {"oldest": _release(proven.oldest(snap.speculators_version)),
                   "newest": _release(proven.newest(snap.speculators_version)),
                   "unproven": unproven,
                   "devices": check.devices,
                   "releases": [{"release": p.release, "archs": list(p.archs), "date": p.date, "by": p.by,
                                 "where": p.where, "speculators": p.speculators} for p in proven.PROVEN]},
    }

    def render(console: Console) -> None:
        from rich.table import Table

        table = Table(title=f"vLLM {snap.vllm.version} facts (static read of {snap.vllm_root})", title_justify="left")
        for col in ("patch", "vLLM symbol", "holds", "evidence", "found"):
            table.add_column(col, overflow="fold", no_wrap=col in ("patch", "evidence"))
        for f in sorted(facts, key=lambda f: f.patch.id):
            mark = "[red]missing[/]" if f.evidence.missing else "[green]yes[/]" if f.evidence.holds else "[dim]no[/]"
            table.add_row(f.patch.id, escape(f.fact.symbol), mark, escape(f.evidence.where), escape(f.evidence.found))
        console.print(table)
        console.print(f"speculators {snap.speculators_version} patches (installed at {snap.speculators_root})")
        table = Table()
        for col in ("patch", "needed", "state", "verdict", "fix"):
            table.add_column(col, overflow="fold")
        for r in sorted(rows, key=lambda r: r["id"]):
            color = "green" if r["verdict"] == "ok" else "red"
            needed = "?" if r["needed"] is None else "yes" if r["needed"] else "no"
            table.add_row(r["id"], needed, r["state"], f"[{color}]{r['verdict']}[/]", escape(r["hint"]))
        console.print(table)
        _render_calls(console, calls, snap)
        _render_imports_and_runner(console, calls)
        _render_findings(console, check, snap, transport)
        console.print(check.line())
        console.print(f"[dim]{SELFTEST_HINT}[/]")

    return Report(data, check.exit_code, render)


# verify's exit code when every static check passes but the installed vLLM's release has no
# engine proof (patcher/proven.py): a script can tell "not proven" (3) from "broken" (1).
UNPROVEN = 3


def _again(subcommand: str, transport: Transport) -> str:
    """``speculators-patch SUBCOMMAND`` as this run reached its target (``--host``/``--exec``,
    ``--ssh-config``, ``--target``, ``--patch-file``): advice copied from the output acts on
    the environment that was checked, not on the active one."""
    import shlex

    from patcher.connect.exec import ExecTransport
    from patcher.connect.ssh import SshTransport

    ctx = click.get_current_context(silent=True)
    params = ctx.params if ctx else {}
    words = ["speculators-patch", subcommand]
    if isinstance(transport, ExecTransport):
        words += ["--exec", transport.command]
    elif isinstance(transport, SshTransport):
        words += ["--host", transport.host] + (["--ssh-config", transport.ssh_config] if transport.ssh_config else [])
    target = params.get("target")
    if target:
        words += ["--target", target]
    for path in (ctx.meta.get("speculators_patch.patch_files") if ctx else None) or ():
        words += ["--patch-file", path]
    return " ".join(shlex.quote(w) for w in words)


def _with_target(hint: str, transport: Transport) -> str:
    """A hint's ``speculators-patch apply``/``revert`` with this run's target options."""
    for sub in ("revert", "apply"):
        hint = hint.replace(f"speculators-patch {sub}", _again(sub, transport))
    return hint


def _release(minor: tuple[int, int] | None) -> str | None:
    return None if minor is None else ".".join(map(str, minor))


# verify reads source; what it cannot see, selftest runs (printed under every verdict).
SELFTEST_HINT = ("verify reads source only: this box's device, attention backend and parallel layout are "
                 "not in it; 'speculators-patch selftest' runs the extraction here and compares it with transformers")


def _render_calls(console: Console, calls: CallsCheck, snap: Snapshot) -> None:
    """The call-site check: each call into vLLM that does not fit, with both file:lines."""
    title = f"calls from speculators into vLLM {snap.vllm.version} ({len(calls.checked)} checked, static)"
    errors = sum(f.severity == "error" for f in calls.findings)
    if not calls.findings:
        console.print(f"{title}: every call fits")
    else:
        console.print(f"{title}: {errors} break(s), {len(calls.findings) - errors} note(s)")
    for f in calls.findings:
        mark = "[red]break[/]" if f.severity == "error" else "[dim]note[/]"
        console.print(f"  {mark} {escape(f'{f.where}: {f.call}: {f.detail}')}")
        console.print(f"        vLLM {escape(f'{f.vllm_where}: {f.vllm_found}')}")
    if calls.runtime is not None:
        rt = calls.runtime
        console.print(f"runtime reading (vLLM {rt.vllm_version} imported by the target, {rt.wall_seconds:.1f} s): "
                      f"{len(rt.findings)} finding(s), "
                      + ("[green]agrees with the static reading[/]" if not rt.disagreements
                         else f"[red]{len(rt.disagreements)} disagreement(s) with the static reading[/]"))
        for line in rt.disagreements:
            console.print(f"  {escape(line)}")


def _render_imports_and_runner(console: Console, calls: CallsCheck) -> None:
    """What importing the generator runs (transformers, vLLM), and the model runner switch."""
    imports = calls.imports
    if imports is not None:
        errors = sum(f.severity == "error" for f in imports.findings)
        title = (f"imports on the generator's import path ({len(imports.modules)} speculators modules, "
                 f"{imports.checked} imports resolved, static)")
        console.print(f"{title}: " + ("every import resolves" if not imports.findings
                                       else f"{errors} break(s), {len(imports.findings) - errors} note(s)"))
        for f in imports.findings:
            mark = "[red]break[/]" if f.severity == "error" else "[dim]note[/]"
            console.print(f"  {mark} {escape(f'{f.where}: {f.statement}: {f.detail}')}")
    runner = calls.runner
    if runner is not None:
        mark = {"error": "[red]break[/]", "warning": "[yellow]warning[/]"}.get(runner.severity, "[dim]note[/]")
        console.print(f"model runner: {mark} {escape(runner.message)}")
        console.print(f"        vLLM {escape(f'{runner.where}: {runner.found}')}")


def do_revert(transport: Transport, snap: Snapshot, chosen, partial: bool, force: bool, dry_run: bool) -> Report:
    from patcher import engine

    if partial:  # the patches kept on the files it re-derives are applied again from the pristine copies
        ids = {p.id for p in chosen}
        entries = (snap.manifest or {}).get("files", {})
        replayed = {pid for path in entries if set(snap.recorded(path)) & ids for pid in snap.recorded(path)}
        _refuse_edited_user_patches(snap, replayed - ids, "this revert")
    result = engine.revert(transport, snap, chosen, partial=partial, force=force, dry_run=dry_run)
    changed = [p.path for p in result.plans if p.changed]
    data = {**_describe(snap), "dry_run": dry_run, "written": result.written, "would_change": changed}

    def render(console: Console) -> None:
        if dry_run:
            console.print(f"dry run: {len(changed)} file(s) would be restored, nothing written")
        elif result.written:
            console.print(f"restored {len(result.written)} file(s) under {snap.speculators_root}: {', '.join(result.written)}")
        else:
            console.print("nothing to revert: no file needed restoring")

    return Report(data, 0, render)


def run_on_target(target, host, ssh_config, action: Callable[[Transport, Snapshot], Report], retry: bool = True) -> Report:
    """Connect, read a snapshot (one exchange), run ``action``; re-read once if a file
    changed between the read and the commit (e.g. another node applied meanwhile)."""
    if ssh_config and host is None:
        raise UserError("--ssh-config is only used with --host or --hosts-file; no host was given")
    from patcher import engine

    transport, site_packages = connect(target, host, ssh_config)
    with transport:
        snap = _first_snapshot(transport, site_packages)
        for attempt in range(1, 6):  # concurrent writers: each retry follows another's success
            try:
                report = action(transport, snap)
                break
            except UserError as e:
                if not (retry and attempt < 5 and str(e).startswith("changed-since-read")):
                    raise
                snap = engine.read_snapshot(transport, site_packages)
        report.notes = _notes(snap)
        report.data["exchanges"] = transport.exchanges
        return report


def _first_snapshot(transport: Transport, site_packages: str | None) -> Snapshot:
    """``engine.read_snapshot``; where no target was named and none is active, a missing
    speculators is said to be missing from the tool's own environment, with the way out."""
    from patcher import engine

    try:
        return engine.read_snapshot(transport, site_packages)
    except UserError as e:
        if getattr(transport, "tool_env", False) and str(e).startswith("no speculators installed"):
            prefix = os.path.dirname(os.path.dirname(sys.executable))
            raise UserError(f"no speculators installed in {prefix}, the environment speculators-patch itself runs in "
                            f"(no --target given, and neither $VIRTUAL_ENV nor $CONDA_PREFIX is set); pass "
                            f"--target PATH: the venv or conda prefix, site-packages directory or Python interpreter "
                            f"of the environment that has speculators") from None
        raise


def _emit(report: Report, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({**report.data, "notes": report.notes, "exit_code": report.exit_code}, indent=1))
    else:
        if report.notes:
            from rich.console import Console

            for note in report.notes:
                Console(stderr=True, highlight=False, soft_wrap=True).print(f"note: {note}")
        print_out(report.render)


def target_options(f):
    f = click.option("--skip", multiple=True, metavar="ID", help="Leave out this patch (id or name); repeatable.")(f)
    f = click.option("--only", multiple=True, metavar="ID", help="Only this patch (id or name); repeatable.")(f)
    return timeout_option(patch_file_option(connection_options(f)))


def _to_meta(key: str):
    """A click callback keeping an option's value in ``ctx.meta[key]`` (read by ``_main``)."""
    return lambda ctx, _param, value: ctx.meta.__setitem__(key, value)


def patch_file_option(f):
    """``--patch-file FILE`` (repeatable): a user patch, loaded by ``_main`` before anything else."""
    return click.option("--patch-file", multiple=True, metavar="FILE", expose_value=False,
                        callback=_to_meta("speculators_patch.patch_files"),
                        help="Also use the patch this Python file defines (PATCH = Patch(...)); repeatable.")(f)


def _load_patch_files() -> None:
    """Load this command's ``--patch-file`` files into the registry (``UserError`` on a bad one)."""
    ctx = click.get_current_context(silent=True)
    paths = ctx.meta.get("speculators_patch.patch_files") if ctx else None
    if paths:
        from patcher.registry import use_patch_files

        use_patch_files(paths)


def _exec_targets() -> list[str]:
    """This command's ``--exec`` commands, as "hosts" the fan-out can carry."""
    ctx = click.get_current_context(silent=True)
    commands = ctx.meta.get("speculators_patch.exec") if ctx else None
    if not commands:
        return []
    from patcher.connect.exec import ExecTarget, split_command

    for command in commands:
        split_command(command)  # an unsplittable command is refused before any target is touched
    return [ExecTarget(c) for c in commands]


def timeout_option(f):
    """``--timeout SECONDS``: the longest wait for each answer of the target's agent."""
    return click.option("--timeout", type=click.FloatRange(1, 86400), metavar="SECONDS", expose_value=False,
                        envvar="SPECULATORS_PATCH_TIMEOUT", callback=_to_meta("speculators_patch.timeout"),
                        help="Give up when the target's agent does not answer a request within this time "
                             "(default 600; a commit keeps going on the target and finishes or rolls back).")(f)


def connection_options(f):
    f = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(f)
    f = click.option("--connect-timeout", type=click.FloatRange(1, 3600), metavar="SECONDS", expose_value=False,
                     envvar="SPECULATORS_PATCH_CONNECT_TIMEOUT", callback=_to_meta("speculators_patch.connect_timeout"),
                     help="Give up when the target's agent has not started within this time: the SSH connection, "
                          "the --exec command, the interpreter (default 30).")(f)
    f = click.option("--ssh-config", metavar="FILE", help="OpenSSH config file to use (like ssh -F).")(f)
    f = click.option("--ssh-persist", type=click.IntRange(0, 86400), metavar="SECONDS", expose_value=False,
                     envvar="SPECULATORS_PATCH_SSH_PERSIST", callback=_to_meta("speculators_patch.ssh_persist"),
                     help="Keep each host's SSH connection open this long after a run, for the next run to "
                          "reuse (default 60; 0: a new connection every run). Off where your ssh_config "
                          "sets ControlPath or ControlMaster.")(f)
    f = click.option("--jobs", type=click.IntRange(1, 256), default=8, show_default=True, expose_value=False,
                     callback=lambda ctx, _p, v: ctx.meta.__setitem__("speculators_patch.jobs", v),
                     help="With several hosts: how many to work on at once.")(f)
    f = click.option("--exec", "exec_commands", multiple=True, metavar="'CMD ...'", expose_value=False,
                     callback=_to_meta("speculators_patch.exec"),
                     help="Run on the Python this command starts, e.g. 'docker exec -i NAME python3' or "
                          "'kubectl exec -i POD -- python3' (argument vector, no shell); repeatable.")(f)
    f = click.option("--hosts-file", type=click.Path(dir_okay=False), help="File with one host per line.")(f)
    f = click.option("--host", "hosts", multiple=True, metavar="HOST",
                     help="Remote machine: an ~/.ssh/config alias or [user@]host[:port]; repeatable.")(f)
    f = click.option("--target", metavar="PATH", multiple=True, callback=_one_target,
                     help="venv/conda prefix, site-packages directory or Python interpreter (default: active env).")(f)
    return f


def _one_target(ctx, param, values: tuple[str, ...]) -> str | None:
    """``--target`` given once (or not): a second one is refused rather than silently winning."""
    if len(values) > 1:
        raise click.BadParameter(f"given {len(values)} times ({', '.join(values)}): one target per run; "
                                 "several hosts take --host", ctx=ctx, param=param)
    return values[0] if values else None


def _read_hosts_file(path: str) -> list[str]:
    """One host per line; blank lines and ``#`` comments (whole-line or trailing) ignored.
    Raises ``UserError`` naming ``FILE:LINE`` for a line that is not text or not a host."""
    from patcher.connect.ssh import parse_host

    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UserError(f"cannot read hosts file {path}: {e.strerror}") from None
    hosts = []
    for number, line in enumerate(raw.split(b"\n"), 1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{path}:{number}: not UTF-8 text") from None
        if "\0" in text:
            raise UserError(f"{path}:{number}: not text (a NUL byte)")
        host = text.split("#", 1)[0].strip()
        if host:
            try:
                parse_host(host)
            except UserError as e:
                raise UserError(f"{path}:{number}: {e}") from None
            hosts.append(host)
    return hosts


def _main(hosts: tuple[str, ...], hosts_file: str | None, command: Callable[[str | None], Report], as_json: bool) -> None:
    """Run ``command`` on the local target or one host; several hosts go to ``patcher.fanout``."""
    try:
        _load_patch_files()
        all_hosts = list(hosts)
        if hosts_file:
            listed = _read_hosts_file(hosts_file)
            if not listed:
                raise UserError(f"no hosts in {hosts_file}")
            all_hosts += listed
        if all_hosts:
            from patcher.connect.ssh import parse_host

            for host in all_hosts:  # every host name checked before any host is contacted
                parse_host(host)
        execs = _exec_targets()
        ctx = click.get_current_context(silent=True)
        if ctx is not None and ctx.params.get("ssh_config") and execs and not all_hosts:
            raise UserError("--ssh-config is only used with --host or --hosts-file; --exec targets do not use SSH")
        if (ctx is not None and not all_hosts
                and ctx.get_parameter_source("ssh_persist") == click.core.ParameterSource.COMMANDLINE):
            raise UserError("--ssh-persist is only used with --host or --hosts-file; no host was given")
        all_hosts += execs
        if len(all_hosts) > 1:
            from patcher.fanout import run_many

            sys.exit(run_many(all_hosts, command, as_json))
        report = command(all_hosts[0] if all_hosts else None)
    except KeyboardInterrupt:
        _interrupted(as_json, None)
    except Interrupted as e:  # during a commit: what became of it
        _interrupted(as_json, str(e))
    except UserError as e:
        message = str(e).replace("\r", "\\r").replace("\n", "\\n")  # one line, whatever the input
        if as_json:
            click.echo(json.dumps({"error": message, "exit_code": 2}))
        else:
            click.echo(f"error: {message}", err=True)
        sys.exit(2)
    _emit(report, as_json)
    sys.exit(report.exit_code)


# The exit code after Ctrl-C (128 + SIGINT, as a shell reports it).
INTERRUPTED_EXIT = 130


def interrupted_message() -> str:
    """After Ctrl-C outside a commit: what this run had already written, or that it wrote nothing."""
    from patcher.connect.transport import COMMITTED

    done = [(label, files) for label, files in COMMITTED if files]
    if not done:
        return "interrupted (Ctrl-C) before anything was written: nothing changed"
    return "interrupted (Ctrl-C) after this run's commit: " + "; ".join(
        f"{label}: {len(files)} file(s) written ({', '.join(files)})" for label, files in done)


def _interrupted(as_json: bool, message: str | None) -> None:
    """Ctrl-C: one line saying whether anything changed, exit 130."""
    message = message or interrupted_message()
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": INTERRUPTED_EXIT}))
    else:
        click.echo(f"error: {message}", err=True)
    sys.exit(INTERRUPTED_EXIT)


class _Group(click.Group):
    """Usage errors as one ``error:`` line (exit 2), like every other refusal; and a closed
    standard output is refused before anything is read or written."""

    def main(self, *args, **kwargs):  # type: ignore[override]
        try:
            os.fstat(1)
        except OSError:
            click.echo("error: standard output is closed; nothing was done", err=True)
            sys.exit(2)
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.UsageError as e:
            hint = f" (see {e.ctx.command_path} --help)" if e.ctx else ""
            click.echo(f"error: {e.format_message()}{hint}".replace("\n", " "), err=True)
            sys.exit(2)
        except click.ClickException as e:
            click.echo(f"error: {e.format_message()}".replace("\n", " "), err=True)
            sys.exit(2)
        except click.Abort:  # Ctrl-C before a command ran (during ones, ``_main`` answers)
            click.echo(f"error: {interrupted_message()}", err=True)
            sys.exit(INTERRUPTED_EXIT)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(patcher.__version__, prog_name="speculators-patch")
def main() -> None:
    """Make an installed speculators (0.3.0, 0.4.0, 0.4.0.1) work with the installed vLLM, reversibly."""


@main.command()
@target_options
@click.option("--dry-run", is_flag=True, help="Show what would be applied; write nothing.")
@click.option("--adopt", is_flag=True, help="A file changed since patching (updated upstream) becomes the new "
              "pristine copy and is patched; revert then gives that newer file back.")
def apply(target, hosts, hosts_file, ssh_config, only, skip, as_json, dry_run, adopt):
    """Rewrite the installed speculators (all-or-nothing, idempotent)."""
    _main(hosts, hosts_file, lambda host: run_on_target(target, host, ssh_config,
                                lambda t, s: do_apply(t, s, select(only, skip, "requires"), dry_run, adopt)), as_json)


@main.command()
@connection_options
@patch_file_option
@timeout_option
def repair(target, hosts, hosts_file, ssh_config, as_json):
    """Rebuild a damaged or lost record from the files and the verified pristine copies."""

    def command(host):
        from patcher import engine

        if ssh_config and host is None:
            raise UserError("--ssh-config is only used with --host or --hosts-file; no host was given")
        transport, site_packages = connect(target, host, ssh_config)
        with transport:
            result = engine.repair(transport, site_packages)
            snap, lines = result.snap, result.lines
            data = {**_describe(snap), "was": snap.state_problem, "files": lines, "unrestorable": result.unrestorable,
                    "exchanges": transport.exchanges}

        def render(console: Console) -> None:
            if snap.state_problem:
                console.print(f"was: {escape(snap.state_problem)}", soft_wrap=True)
            for line in lines:
                console.print(f"  {escape(line)}", soft_wrap=True)  # commands in them stay whole
            if result.unrestorable:
                console.print(f"repair: {len(result.unrestorable)} file(s) differ from what pip installed and nothing "
                              f"kept here restores them (listed above); the record covers the rest")
            else:
                console.print("repaired: the record matches the files" if snap.state_problem
                              else "nothing to repair: the record already matched the files; checked again")

        return Report(data, 1 if result.unrestorable else 0, render)

    _main(hosts, hosts_file, command, as_json)


@main.command()
@target_options
def diff(target, hosts, hosts_file, ssh_config, only, skip, as_json):
    """Print what apply would change as a unified diff; exit 1 when there are changes."""
    _main(hosts, hosts_file, lambda host: run_on_target(target, host, ssh_config, lambda t, s: do_diff(t, s, select(only, skip, "requires"))), as_json)


@main.command()
@target_options
def status(target, hosts, hosts_file, ssh_config, only, skip, as_json):
    """Show each file's state and each patch: applied / pending / not needed."""
    _main(hosts, hosts_file, lambda host: run_on_target(target, host, ssh_config, lambda t, s: do_status(t, s, select(only, skip))), as_json)


@main.command(name="verify")
@target_options
@click.option("--runtime", is_flag=True,
              help="Also import vLLM in the target's interpreter and confirm the call check on the live objects (slow).")
def verify_command(target, hosts, hosts_file, ssh_config, only, skip, as_json, runtime):
    """Check vLLM's API (static read, with evidence) and the patched speculators agree."""
    _main(hosts, hosts_file, lambda host: run_on_target(target, host, ssh_config,
                                lambda t, s: do_verify(t, s, select(only, skip), runtime)), as_json)


@main.command()
@target_options
@click.option("--force", is_flag=True, help="Also restore files modified after patching (their edits are lost).")
@click.option("--dry-run", is_flag=True, help="Show what would be restored; write nothing.")
def revert(target, hosts, hosts_file, ssh_config, only, skip, as_json, force, dry_run):
    """Restore the pristine files byte for byte (or drop only the selected patches)."""
    partial = bool(only or skip)
    _main(hosts, hosts_file, lambda host: run_on_target(target, host, ssh_config,
                                lambda t, s: do_revert(t, s, select(only, skip, "dependents", s.applied_ids()), partial, force, dry_run)), as_json)


@main.command()
@connection_options
@click.option("--arch", "archs", multiple=True, type=click.Choice(SELFTEST_ARCHS),
              help="Architecture to build and check; repeatable (default: llama, plus --model's).")
@click.option("--model", metavar="PATH", help="A real model's directory or config.json on the target: "
              "a tiny model of its architecture is checked too.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("--tp", type=click.IntRange(1, 64), default=1, show_default=True, help="Tensor parallel size.")
@click.option("--runner", type=click.Choice(["auto", "v1", "v2", "both"]), default="auto", show_default=True,
              help="GPU model runner: vLLM's own choice, V1, Model Runner V2, or one run with each.")
@click.option("--timeout", type=click.IntRange(60, 86400), default=3600, show_default=True, metavar="SECONDS")
def selftest(target, hosts, hosts_file, ssh_config, as_json, archs, model, device, tp, runner, timeout):
    """Prove extraction on this box: speculators' generator vs transformers on tiny models."""
    from patcher.selftest.command import request

    _main(hosts, hosts_file, lambda host: run_on_target(target, host, ssh_config, lambda t, s: do_selftest(
        t, s, request(archs, model, device, tp, runner), timeout, host)), as_json)


def do_selftest(transport: Transport, snap: Snapshot, req: dict, timeout: float, host: str | None) -> Report:
    from rich.console import Console

    from patcher.selftest.command import render, run_remote, summarize

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    transport.on_progress = lambda line: err.print(f"{host + ': ' if host else ''}{line}", markup=False)
    if snap.speculators_version is None:
        raise UserError(f"{transport.label}: speculators is not installed in this environment")
    from patcher import engine

    engine.check_supported(snap)  # a speculators no patch is written for: its generator is not ours to test
    report = summarize(run_remote(transport, snap, req, timeout))
    return Report({**_describe(snap), "ok": report["ok"], "selftest": report}, 0 if report["ok"] else 1,
                  lambda console: render(report, console))


@main.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@patch_file_option
def list_command(as_json):
    """List every patch (shipped, installed packs, --patch-file) with the vLLM fact it depends on."""
    from rich.table import Table

    from patcher.registry import all_patches
    from patcher.userpatches.loader import describe, origin_fields

    try:
        _load_patch_files()
        patches = all_patches()
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    rows = [{"id": p.id, "name": p.name, "version": p.version, "file": p.file, "title": p.title,
             **origin_fields(p),
             "facts": [{"symbol": f.symbol, "modules": list(f.modules), "summary": f.summary,
                        "first_release": f.first_release} for f in p.facts], "depends_on": p.depends_on}
            for p in sorted(patches, key=lambda p: p.id)]
    users = {p.id: describe(p) for p in patches if p.origin != "shipped"}
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table()
    for col in ("id", "name", "v", "file", "depends on", *(("origin",) if users else ())):
        table.add_column(col, overflow="fold")
    for r in rows:
        deps = "; ".join(f"{f['symbol']} ({', '.join(f['modules'])}, >= {f['first_release']})" for f in r["facts"])
        origin = (escape(users.get(r["id"], "shipped")),) if users else ()
        table.add_row(r["id"], r["name"], str(r["version"]), r["file"].rsplit("/", 1)[-1], deps or r["depends_on"] or "speculators' own logic",
                      *origin)
    print_out(lambda console: console.print(table))


@main.command()
@click.argument("patch_id", metavar="ID")
@click.option("--file", "file", required=True, metavar="speculators/....py",
              help="The speculators file the patch rewrites, relative to site-packages.")
@click.option("-o", "--output", required=True, metavar="FILE.py", help="Where to write the patch (its test goes next to it).")
@click.option("--speculators", default="0.3.0", show_default=True, help="The speculators release it is written for.")
@click.option("--force", is_flag=True, help="Overwrite existing files.")
def new(patch_id, file, output, speculators, force):
    """Write a commented patch file to start a fix from, and its pytest file."""
    from patcher.userpatches.template import write

    try:
        patch_path, test_path = write(patch_id, file, output, speculators, force)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    import importlib.util
    import shlex

    python = shlex.quote(sys.executable)
    run_tests = f"`{python} -m pytest {shlex.quote(str(test_path))}` (the Python speculators-patch runs in)"
    try:
        has_pytest = importlib.util.find_spec("pytest") is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as none
        has_pytest = False
    if not has_pytest:  # `pip install .` brings no pytest
        run_tests = (f"`{python} -m pip install pytest` (the Python speculators-patch runs in has none), then "
                     f"`{python} -m pytest {shlex.quote(str(test_path))}`")
    click.echo(f"wrote {patch_path} and {test_path}\n"
               f"next: edit both, {run_tests}, then "
               f"`speculators-patch diff --patch-file {shlex.quote(str(patch_path))} --target ...`")

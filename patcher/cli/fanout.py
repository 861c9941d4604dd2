"""One subcommand on several hosts: in parallel, bounded, each host on its own.

Every host runs the same ``command(host) -> Report`` (one SSH connection each) in a pool
of at most ``jobs`` workers. The workers are forked processes where the platform has
``fork``: reading, transforming and verifying happen locally and are CPU-bound Python, so
threads would run them one host at a time under the GIL (threads are the fallback).
A host that fails -- a ``UserError`` or anything else -- is recorded with its reason and
never stops or touches the others. Progress goes to stderr; the end is one summary table
(or, with ``--json``, ``{"hosts": [one object per host], "exit_code": n}``). Each host's
(outcome, reason) is the verb's own: the ``outcome`` of the result object its
``patcher.commands`` verb returned, carried by the ``Report`` (``Report.outcome``); nothing
here tells one verb from another. For ``status`` each host's outcome is the state of its
install, and the last line is ``commands.common.hosts_summary`` of the hosts' outcomes.
Exit code: 0 when every host succeeded, 2 when any host failed or is unsupported, else 1
when ``diff`` found changes, ``verify`` disagreements, an ``apply`` whose result fails
verify's checks or a ``status`` whose install is not patched somewhere (each host's code is
the verb's own), else the largest (3: every static check passed but some host's vLLM has no
engine proof); 130 after Ctrl-C.
"""

from __future__ import annotations

import contextvars
import multiprocessing
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from patcher.cli import jsontext
from patcher.cli.options import DEFAULT_JOBS
from patcher.commands.common import hosts_summary
from patcher.errors import Interrupted, Unsupported, UserError, interrupted_exit, interruption
from patcher.ways import Way, render


@dataclass
class HostResult:
    """One host's row of a run over several hosts: its (outcome, reason), the verb's exit
    code, the time it took, its report's data and the notes on its install."""

    host: str
    # changed | unchanged | would-change | ok | disagrees (verify, or apply then verify) | unproven | failed |
    # unsupported | unrestorable, repaired (repair) | status: the install's state (patched | pristine | partial |
    # stale | modified | broken | reinstalled | unsupported)
    outcome: str
    exit_code: int
    reason: str
    seconds: float
    data: dict | None = None
    notes: tuple[str, ...] = ()

    def as_json(self) -> dict:
        """This host's object in ``{"hosts": [...]}`` of ``--json``."""
        return {
            "host": self.host,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "reason": self.reason or None,
            "seconds": round(self.seconds, 3),
            "notes": list(self.notes),
            "report": self.data,
        }


def outcome_of(report) -> tuple[str, str]:
    """(outcome, reason) of one host's ``Report``: the verb's own (``Report.outcome``, from its
    result's ``outcome``); for a report that carries none, ``ok`` on exit code 0, else
    ``failed`` with the exit code."""
    if report.outcome is not None:
        return report.outcome
    return ("ok", "") if report.exit_code == 0 else ("failed", f"exit code {report.exit_code}")


def _run_one(host: str, command: Callable[[str], object]) -> HostResult:
    start = time.monotonic()
    try:
        report = command(host)
    except KeyboardInterrupt:  # Ctrl-C reaches the workers too (one process group)
        from patcher.cli.render import interrupted_message

        return HostResult(host, "failed", interrupted_exit(), interrupted_message(), time.monotonic() - start)
    except Interrupted as e:  # during this host's commit: what became of it
        return HostResult(host, "failed", interrupted_exit(), str(e), time.monotonic() - start)
    except Unsupported as e:  # no patch here is written for it: a refusal, named as such
        return HostResult(host, "unsupported", 2, str(e), time.monotonic() - start)
    except UserError as e:
        return HostResult(host, "failed", 2, str(e), time.monotonic() - start)
    except Exception as e:  # a bug must not take the other hosts down
        return HostResult(host, "failed", 2, f"internal error: {type(e).__name__}: {e}", time.monotonic() - start)
    outcome, reason = outcome_of(report)
    return HostResult(
        host, outcome, report.exit_code, reason, time.monotonic() - start, report.data, tuple(report.notes)
    )


# The command of the current run, for forked workers: a closure cannot be pickled, but a
# forked child inherits it. Set only while ``run_many`` runs.
_COMMAND: Callable[[str], object] | None = None


def _run_inherited(host: str) -> HostResult:
    assert _COMMAND is not None
    return _run_one(host, _COMMAND)


def _in_context(pool: Executor, host: str) -> tuple:
    """What to submit for ``host``: a forked worker inherits this command's context (its
    ``--no-cache``, ``cache.switched_off``); a thread gets a copy of it."""
    if isinstance(pool, ThreadPoolExecutor):
        return contextvars.copy_context().run, _run_inherited, host
    return _run_inherited, host


def _pool(workers: int) -> Executor:
    if "fork" in multiprocessing.get_all_start_methods():
        return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    return ThreadPoolExecutor(workers, thread_name_prefix="host")


_COLORS = {
    "changed": "green",
    "unchanged": "dim",
    "ok": "green",
    "would-change": "yellow",
    "disagrees": "red",
    "failed": "red",
    "unproven": "yellow",
    "patched": "green",
    "pristine": "yellow",
    "partial": "red",
    "stale": "red",
    "modified": "red",
    "unsupported": "red",
    "unrestorable": "red",
    "repaired": "green",
}


def summary_table(results: list[HostResult]) -> Table:
    """The per-host summary table: host, outcome (coloured), time and reason."""
    table = Table(title="per-host summary", title_justify="left")
    for col in ("host", "result", "time", "detail"):
        table.add_column(col, overflow="fold")
    for r in results:
        table.add_row(
            escape(r.host), f"[{_COLORS.get(r.outcome, '')}]{r.outcome}[/]", f"{r.seconds:.1f}s", escape(r.reason)
        )
    return table


def _warm() -> None:
    """Import, in the parent, what every host's command needs (the engine, the checks, the
    patch list, the tool digest), so the forked workers share it instead of each importing
    and reading it again. A failure here is left for each host to report as its own."""
    import importlib

    try:
        for name in (
            "patcher.engine",
            "patcher.checks.verify",
            "patcher.checks.calls_cache",
            "patcher.checks.attribute_reads",
            "patcher.connect.ssh",
        ):
            importlib.import_module(name)
        from patcher.digest import tool
        from patcher.fixes.registry import shipped_patches

        shipped_patches()
        tool()
    except Exception:  # the same failure is raised again, per host, by the command itself
        pass


_UNKNOWN = (
    f"interrupted ({{}}) while working on this host; what it did there is not known here: run `{Way('status')}` on it"
)
_NOT_STARTED = "interrupted ({}) before this host was contacted: nothing changed there"


def _plainly(host: str, text: str) -> str:
    """``text`` with its ways out said plainly, for any host (``run_many``'s default)."""
    return render(text)


def _collect_interrupted(futures: dict, results: dict, worded=_plainly, wait: float = 45.0) -> None:
    """After Ctrl-C: the answers of hosts already running, for up to ``wait`` seconds (a
    second Ctrl-C stops waiting). Every host gets a result: its own answer (a commit in
    flight waited for and reported), unknown, or never contacted (its ways out said by
    ``worded(host, text)``)."""
    from concurrent.futures import CancelledError

    def failed(host: str, text: str) -> HostResult:
        return HostResult(host, "failed", interrupted_exit(), worded(host, text.format(interruption())), 0.0)

    deadline = time.monotonic() + wait
    stop = False
    for future, host in futures.items():
        if host in results:
            continue
        if future.cancel() or future.cancelled():
            results[host] = failed(host, _NOT_STARTED)
            continue
        if stop:
            results[host] = failed(host, _UNKNOWN)
            continue
        try:
            results[host] = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            stop = True
            results[host] = failed(host, _UNKNOWN)
        except CancelledError:
            results[host] = failed(host, _NOT_STARTED)
        except Exception:  # timed out, or the worker died of the interrupt
            results[host] = failed(host, _UNKNOWN)


def run_many(hosts: list[str], command: Callable, as_json: bool, jobs: int | None = None, worded=_plainly) -> int:
    """Run ``command`` on every host, at most ``jobs`` at once; print progress and a summary.
    ``worded(host, text)`` says the ways out in a row written here (``command`` words its own).

    Returns the exit code for all hosts together (see the module docstring).
    """
    jobs = max(1, jobs or DEFAULT_JOBS)
    hosts = list(dict.fromkeys(hosts))  # the same host twice would only race itself
    global _COMMAND
    err = Console(stderr=True, highlight=False)
    results: dict[str, HostResult] = {}
    workers = min(jobs, len(hosts))
    _COMMAND = command
    _warm()
    pool = _pool(workers)
    interrupted = False
    futures: dict = {}
    try:
        futures = {
            pool.submit(*_in_context(pool, h)): h for h in hosts
        }  # workers start here, before any progress thread
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as progress:
            task = progress.add_task(
                f"{len(hosts)} host{'' if len(hosts) == 1 else 's'}, {workers} at a time", total=len(hosts)
            )
            for future in as_completed(futures):
                host = futures[future]
                try:
                    r = future.result()
                except Exception as e:  # the worker process itself died
                    r = HostResult(host, "failed", 2, f"internal error: worker died: {type(e).__name__}: {e}", 0.0)
                results[host] = r
                progress.console.print(  # one line a host, whatever its length: grep finds it whole
                    f"[{_COLORS.get(r.outcome, '')}]{r.outcome:>12}[/] {escape(r.host)}"
                    + (f": {escape(r.reason)}" if r.reason else ""),
                    soft_wrap=True,
                )
                progress.advance(task)
    except KeyboardInterrupt:
        # Each worker got the Ctrl-C too and answers for its host (a commit in flight is
        # waited for, then reported); hosts not started yet are not contacted.
        interrupted = True
        _collect_interrupted(futures, results, worded)
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)
        _COMMAND = None
    for host in hosts:
        results.setdefault(
            host, HostResult(host, "failed", interrupted_exit(), _NOT_STARTED.format(interruption()), 0.0)
        )
    ordered = [results[h] for h in hosts]
    if interrupted:
        code = interrupted_exit()
    elif any(r.outcome in ("failed", "unsupported") for r in ordered):
        code = 2
    elif any(r.exit_code == 1 for r in ordered):  # a disagreement anywhere outweighs "not proven"
        code = 1
    else:
        code = max(r.exit_code for r in ordered)
    try:
        if as_json:
            click.echo(jsontext.dumps({"hosts": [r.as_json() for r in ordered], "exit_code": code}, indent=1))
        else:
            from patcher.cli.render import print_out

            print_out(lambda console: console.print(summary_table(ordered)))
            click.echo(hosts_summary([r.outcome for r in ordered]))
    except KeyboardInterrupt:  # every host has answered: never "nothing changed" now
        raise Interrupted(
            f"interrupted ({interruption()}) while the summary was printed, after every host answered: "
            f"each host's line above says what it did"
        ) from None
    return code

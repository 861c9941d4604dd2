"""One run's command-line options, read once by the command's click function and passed
down from there (``Options``), and the advice that repeats them (``Advice``): a command
copied from the output acts on the target this run checked, not on the active one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from patcher import ways
from patcher.ways import Way

if TYPE_CHECKING:
    from patcher.cli.render import Report

DEFAULT_JOBS = 8  # --jobs: hosts worked on at once


@dataclass(frozen=True)
class Options:
    """What the command line said, for every layer below the click functions.

    ``target`` (``--target``, once at most), the hosts (``--host``, ``--hosts-file``,
    ``--exec``), ``ssh_config``, ``patch_files``, the waits (``connect_timeout``,
    ``timeout``: None for the transport's defaults), ``ssh_persist`` (and whether it was given
    on the command line: ``ssh_persist_given``), ``jobs``, ``as_json``, ``no_cache``, the patch choice
    (``only``, ``skip``) and the verbs' own flags."""

    target: str | None = None
    hosts: tuple[str, ...] = ()
    hosts_file: str | None = None
    exec_commands: tuple[str, ...] = ()
    ssh_config: str | None = None
    patch_files: tuple[str, ...] = ()
    connect_timeout: float | None = None
    timeout: float | None = None
    ssh_persist: int | None = None
    ssh_persist_given: bool = False
    jobs: int = DEFAULT_JOBS
    as_json: bool = False
    no_cache: bool = False
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    dry_run: bool = False
    adopt: bool = False
    allow_partial: bool = False
    force: bool = False
    runtime: bool = False


# Verbs whose command line has no --patch-file (the way is said without this run's).
NO_PATCH_FILE = ("selftest",)


@dataclass(frozen=True)
class Advice:
    """Way-out commands worded for one run on one target, ``host``: an SSH host, an
    ``--exec`` command (``patcher.connect.exec.ExecTarget``) or None for this machine. The
    layers below write a way out as a ``patcher.ways.Way`` token; this is where it is said,
    once: the CLI words each target's report and refusal with it (``cli.run.worded``), the
    Ansible plugins each task's result."""

    opts: Options
    host: str | None = None

    def say(self, way: Way) -> str:
        """``speculators-patch VERB`` with this run's target options (``--host``/``--exec``,
        ``--ssh-config``, ``--target``, ``--patch-file``), then the way's own flags."""
        import shlex

        from patcher.connect.exec import ExecTarget

        words = [ways.PROGRAM, way.verb]
        if isinstance(self.host, ExecTarget):
            words += ["--exec", self.host]
        elif self.host is not None:
            words += ["--host", self.host] + (["--ssh-config", self.opts.ssh_config] if self.opts.ssh_config else [])
        if self.opts.target:
            words += ["--target", self.opts.target]
        if way.verb not in NO_PATCH_FILE:
            for path in self.opts.patch_files:
                words += ["--patch-file", path]
        return " ".join(shlex.quote(w) for w in [*words, *way.flags])

    def render(self, text: str) -> str:
        """``text`` with each way out in it said for this run (``say``)."""
        return ways.render(text, self.say)

    def report(self, shown: Report) -> Report:
        """``shown`` with each way out said for this run: in its data, notes and row here,
        and in its lines as its console prints them (``Report.say``)."""
        shown.data = ways.render_all(shown.data, self.say)
        shown.notes = [self.render(note) for note in shown.notes]
        if shown.outcome is not None:
            shown.outcome = (shown.outcome[0], self.render(shown.outcome[1]))
        shown.say = self.say
        return shown

"""One run's command-line options, read once by the command's click function and passed
down from there (``Options``), and the advice that repeats them (``again``): a command
copied from the output acts on the target this run checked, not on the active one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from patcher.connect.transport import Transport

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


def again(subcommand: str, transport: Transport, opts: Options) -> str:
    """``speculators-patch SUBCOMMAND`` as this run reached its target (``--host``/``--exec``,
    ``--ssh-config``, ``--target``, ``--patch-file``)."""
    import shlex

    from patcher.connect.exec import ExecTransport
    from patcher.connect.ssh import SshTransport

    words = ["speculators-patch", subcommand]
    if isinstance(transport, ExecTransport):
        words += ["--exec", transport.command]
    elif isinstance(transport, SshTransport):
        words += ["--host", transport.host] + (["--ssh-config", transport.ssh_config] if transport.ssh_config else [])
    if opts.target:
        words += ["--target", opts.target]
    for path in opts.patch_files:
        words += ["--patch-file", path]
    return " ".join(shlex.quote(w) for w in words)


@dataclass(frozen=True)
class Advice:
    """Way-out commands worded for this run: ``advise(hint)`` gives a hint's
    ``speculators-patch apply``/``revert``/``repair`` this run's target options (the
    ``advise`` the verbs of ``patcher.commands`` take); ``again(subcommand)`` is one such
    command."""

    transport: Transport
    opts: Options

    def again(self, subcommand: str) -> str:
        """``speculators-patch SUBCOMMAND`` with this run's target options."""
        return again(subcommand, self.transport, self.opts)

    def advise(self, hint: str) -> str:
        """``hint`` with each ``speculators-patch apply``/``revert``/``repair`` in it given
        this run's target options."""
        for sub in ("revert", "apply", "repair"):
            hint = hint.replace(f"speculators-patch {sub}", self.again(sub))
        return hint

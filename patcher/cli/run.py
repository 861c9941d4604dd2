"""One verb on one target, as the command line runs it: a ``Verb`` is the named functions
that call a ``patcher.commands`` verb with this run's ``Options`` and turn its answer into a
``Report``; ``run_on_target`` connects and runs one; ``all_hosts`` is every target a run
names. ``--target`` and ``--only``/``--skip`` go down from here by name: ``connect`` to
``patcher.connect.choose.transport_for``, ``select`` to ``patcher.commands.common.chosen``
(``PatchSet.select`` on the target's patches). ``--patch-file`` becomes the run's
``PatchSet`` once (``run_patches``), passed to each target's read. ``worded`` says the ways out
in each target's report and refusal with this run's target options (``Advice``)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from patcher.cli import reports
from patcher.cli.options import Advice, Options
from patcher.cli.render import Report
from patcher.commands import session
from patcher.commands.common import notes
from patcher.errors import UserError

if TYPE_CHECKING:
    from patcher.commands.selftest import SelfTested
    from patcher.connect.session import Session
    from patcher.connect.transport import Transport
    from patcher.engine import Snapshot
    from patcher.fixes.registry import PatchSet


# --- One target, or several ---------------------------------------------------------------


class Verb(NamedTuple):
    """One verb as the command line runs it on a target: ``run(opts, work, snap)`` calls
    the ``patcher.commands`` verb (through ``commands.session.run``: the first snapshot, and
    a fresh one when a file changed between the read and the commit, unless not ``retry``);
    ``report(snap, done)`` turns its answer into a ``Report``."""

    run: Callable[[Options, Session, Snapshot], Any]
    report: Callable[[Snapshot, Any], Report]
    retry: bool = True


def worded(opts: Options, command: Callable[[str | None], Report]) -> Callable[[str | None], Report]:
    """``command(host)`` with every way out in its report, or in its refusal, said for that
    host with this run's target options (``Advice``): the one place the command line words them."""

    def run(host: str | None) -> Report:
        advice = Advice(opts, host)
        try:
            return advice.report(command(host))
        except UserError as e:  # Interrupted and Unsupported too, each as itself
            raise type(e)(advice.render(str(e))) from None

    return run


def connect(opts: Options, host: str | None) -> Transport:
    """The transport to the target's agent (``patcher.connect.choose.transport_for``), with
    this run's waits and ``--ssh-persist``. ``host`` is an SSH host, an ``--exec`` command
    (``patcher.connect.exec.ExecTarget``), or None for this machine."""
    from patcher.connect.choose import transport_for

    return transport_for(
        opts.target, host, opts.ssh_config, opts.ssh_persist, connect_timeout=opts.connect_timeout, timeout=opts.timeout
    )


def run_on_target(opts: Options, verb: Verb, patches: PatchSet, host: str | None) -> Report:
    """Connect to ``host`` (None: this machine), run ``verb`` there with this run's
    ``patches`` (``run_patches``) and report its answer, with the notes on the install and
    the number of exchanges it took."""
    from patcher.connect.session import Session
    from patcher.errors import Interrupted

    transport = connect(opts, host)
    work = None
    try:
        # Ctrl-C leaves this block as KeyboardInterrupt, so that the transport passes it on to
        # an --exec command's own process group instead of waiting for that command to end.
        with transport, Session(transport) as work:
            snap, done = session.run(work, functools.partial(verb.run, opts, work), verb.retry, patches)
            shown = verb.report(snap, done)
            shown.notes = notes(snap)
            shown.written = [(work.label, list(work.written))]
        shown.data["exchanges"] = transport.exchanges
        return shown
    except KeyboardInterrupt:  # what this run had already written on the target, from its session
        if work is None:
            raise
        from patcher.cli.render import interrupted_message

        raise Interrupted(interrupted_message([(work.label, work.written)])) from None


def read_hosts_file(path: str) -> list[str]:
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


def all_hosts(opts: Options) -> list:
    """Every host of this run: ``--host``, ``--hosts-file``, then ``--exec`` commands, each
    checked before any is contacted; the SSH options refused where no host uses them."""
    hosts = list(opts.hosts)
    if opts.hosts_file:
        listed = read_hosts_file(opts.hosts_file)
        if not listed:
            raise UserError(f"no hosts in {opts.hosts_file}")
        hosts += listed
    if hosts:
        from patcher.connect.ssh import parse_host

        for host in hosts:
            parse_host(host)
    if not hosts and opts.ssh_config:
        raise UserError(
            "--ssh-config is only used with --host or --hosts-file; "
            + ("--exec targets do not use SSH" if opts.exec_commands else "no host was given")
        )
    if not hosts and opts.ssh_persist_given:
        raise UserError("--ssh-persist is only used with --host or --hosts-file; no host was given")
    if opts.exec_commands:
        from patcher.connect.exec import ExecTarget, split_command

        for command in opts.exec_commands:
            split_command(command)  # an unsplittable command is refused before any target is touched
        hosts += [ExecTarget(c) for c in opts.exec_commands]
    return hosts


def run_patches(opts: Options) -> PatchSet:
    """This run's patches: shipped, installed packs and ``--patch-file`` files
    (``registry.loaded``). Raises ``UserError`` on a bad file or pack."""
    from patcher.fixes.registry import loaded

    return loaded(opts.patch_files)


# --- The verbs, as the command line runs them ----------------------------------------------


def apply_on(opts: Options, work: Session, snap: Snapshot):
    """``apply``: its request (``commands.requests``) from this run's options."""
    from patcher.commands.requests import ApplyRequest

    request = ApplyRequest(opts.only, opts.skip, opts.dry_run, opts.adopt, opts.allow_partial)
    return request.run(work, snap)


def diff_on(opts: Options, work: Session, snap: Snapshot):
    """``diff``: its request from this run's options."""
    from patcher.commands.requests import DiffRequest

    return DiffRequest(opts.only, opts.skip).run(work, snap)


def status_on(opts: Options, work: Session, snap: Snapshot):
    """``status``: its request from this run's options."""
    from patcher.commands.requests import StatusRequest

    return StatusRequest(opts.only, opts.skip).run(work, snap)


def verify_on(opts: Options, work: Session, snap: Snapshot):
    """``verify``: its request from this run's options (``--runtime``)."""
    from patcher.commands.requests import VerifyRequest

    return VerifyRequest(opts.only, opts.skip, opts.runtime).run(work, snap)


def revert_on(opts: Options, work: Session, snap: Snapshot):
    """``revert``: its request from this run's options."""
    from patcher.commands.requests import RevertRequest

    return RevertRequest(opts.only, opts.skip, opts.force, opts.dry_run).run(work, snap)


APPLY = Verb(apply_on, reports.apply_report)
DIFF = Verb(diff_on, reports.diff_report)
STATUS = Verb(status_on, reports.status_report)
VERIFY = Verb(verify_on, reports.verify_report)
REVERT = Verb(revert_on, reports.revert_report)


def repair_on(opts: Options, patches: PatchSet, host: str | None) -> Report:
    """``commands.repair.repair`` on one target with this run's ``patches``: it reads the
    target itself, before and after the agent's repair (no first snapshot of
    ``commands.session``)."""
    from patcher.commands.repair import repair as verb

    transport = connect(opts, host)
    with transport:
        shown = reports.repair_report(verb(transport, patches))
        shown.data["exchanges"] = transport.exchanges
        return shown


def check_draft_on(
    opts: Options, draft: str, data_config: str | None, verifier: str | None, patches: PatchSet, host: str | None
) -> Report:
    """``commands.check_draft.check_draft`` on one target: it reads the draft, the verifier and
    vLLM's files itself (no snapshot of speculators: a serving box may have none); ``patches``
    is unused (the run's set, which ``_main`` hands every verb)."""
    from patcher.commands.check_draft import check_draft as verb

    transport = connect(opts, host)
    with transport:
        shown = reports.check_draft_report(verb(transport, draft, data_config, verifier))
        shown.data["exchanges"] = transport.exchanges
        return shown


class SelftestRun(NamedTuple):
    """``commands.selftest.selftest`` on one host with this run's request and its own time
    limit; it relays the check's progress lines as they arrive (``host: `` first when a host
    was named)."""

    request: dict
    limit: float
    host: str | None

    def __call__(self, opts: Options, work: Session, snap: Snapshot) -> SelfTested:
        """The check on ``snap``'s target, its progress relayed; returns a ``SelfTested``.
        Raises ``UserError`` as ``commands.selftest.selftest``."""
        from patcher.commands.selftest import selftest as verb

        reports.relay_progress(work.transport, self.host)
        return verb(work.transport, snap, self.request, self.limit)


def selftest_on(opts: Options, request: dict, limit: float, patches: PatchSet, host: str | None) -> Report:
    """``selftest`` on one host (None: this machine), with this run's ``patches``."""
    return run_on_target(opts, Verb(SelftestRun(request, limit, host), reports.selftest_report), patches, host)

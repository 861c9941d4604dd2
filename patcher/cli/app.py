"""The ``speculators-patch`` command line: apply, diff, verify, status, revert, repair, selftest,
list, new -- options, one target or a fan-out over several, exit codes. The verbs themselves
are ``patcher.commands``; what they print, ``patcher.cli.reports`` and ``patcher.cli.render``.

Exit codes: 0 success; 1 ``diff`` found changes, ``verify`` found disagreements, ``apply``
left an install that fails verify's checks, or ``repair`` found a file nothing kept restores;
2 bad input or a refused operation (one line on stderr, nothing changed); 3 ``verify`` (and
``apply``): every static check passes, but the installed vLLM release has no engine proof
(``UNPROVEN``); 130 Ctrl-C (one line saying whether anything changed).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Callable, TypeVar

import click

import patcher
from patcher.cli.render import INTERRUPTED_EXIT, Report, escape, interrupted_message, print_out, with_target
from patcher.cli import reports
from patcher.commands import session
from patcher.commands.common import describe as describe_target, notes
from patcher.errors import Interrupted, UserError
from patcher.commands.selftest import ARCHS as SELFTEST_ARCHS

# Imported where used, not here: ``--version`` imports none of these, read-only commands
# on a patched install never import libcst, and rich is imported only to render
# (docs/speed.md).
if TYPE_CHECKING:
    from rich.console import Console

    from patcher.connect.transport import Transport
    from patcher.engine import Snapshot

T = TypeVar("T")


def select(only: tuple[str, ...], skip: tuple[str, ...], keep: str | None = None, applied: set[str] | None = None):
    """``patcher.fixes.registry.select``, imported on first use."""
    from patcher.fixes.registry import select as chosen

    return chosen(only, skip, keep, applied)


def connect(target: str | None, host: str | None = None, ssh_config: str | None = None) -> Transport:
    """The transport to the target's agent (``patcher.connect.choose.transport_for``), with
    this command's ``--connect-timeout``, ``--timeout`` and ``--ssh-persist``. ``host`` is
    an SSH host, or an ``--exec`` command (``patcher.connect.exec.ExecTarget``)."""
    from patcher.connect.choose import transport_for

    ctx = click.get_current_context(silent=True)
    waits = {}
    for name, key, variable in (("connect_timeout", "speculators_patch.connect_timeout", "SPECULATORS_PATCH_CONNECT_TIMEOUT"),
                                ("timeout", "speculators_patch.timeout", "SPECULATORS_PATCH_TIMEOUT")):
        value = ctx.meta.get(key) if ctx else None
        if value is None and os.environ.get(variable) and not (ctx and key in ctx.meta):
            value = _seconds(os.environ[variable], variable)  # selftest: its --timeout is its own run's
        waits[name] = value
    persist = ctx.meta.get("speculators_patch.ssh_persist") if ctx else None
    return transport_for(target, host, ssh_config, persist, **waits)


def _seconds(text: str, variable: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 86400:
        raise UserError(f"${variable} is {text!r}: expected seconds between 1 and 86400")
    return value


def run_on_target(target, host, ssh_config, verb: Callable[[Transport, Snapshot], T],
                  report: Callable[[Transport, Snapshot, T], Report], retry: bool = True) -> Report:
    """Connect, and run ``verb`` (a ``patcher.commands`` verb: data) through
    ``commands.session.run`` -- the first snapshot, and a fresh one when a file changed
    between the read and the commit; then ``report`` turns its answer into what is printed."""
    if ssh_config and host is None:
        raise UserError("--ssh-config is only used with --host or --hosts-file; no host was given")
    transport = connect(target, host, ssh_config)
    with transport:
        snap, done = session.run(transport, lambda snap: verb(transport, snap), retry)
        shown = report(transport, snap, done)
        shown.notes = notes(snap)
        shown.data["exchanges"] = transport.exchanges
        return shown


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
        from patcher.fixes.registry import use_patch_files

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
    """Run ``command`` on the local target or one host; several hosts go to ``patcher.cli.fanout``."""
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
            from patcher.cli.fanout import run_many

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
        argv = list(args[0] if args else kwargs.get("args") or sys.argv[1:])
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.UsageError as e:
            hint = f" (see {e.ctx.command_path} --help)" if e.ctx else ""
            _usage_error(f"{e.format_message()}{hint}", "--json" in argv)
        except click.ClickException as e:
            _usage_error(e.format_message(), "--json" in argv)
        except click.Abort:  # Ctrl-C before a command ran (during ones, ``_main`` answers)
            click.echo(f"error: {interrupted_message()}", err=True)
            sys.exit(INTERRUPTED_EXIT)


def _usage_error(message: str, as_json: bool) -> None:
    """A refused command line: one ``error:`` line (as JSON on stdout with ``--json``), exit 2."""
    message = message.replace("\n", " ")
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": 2}))
    else:
        click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(patcher.__version__, prog_name="speculators-patch")
def main() -> None:
    """Make an installed speculators (0.3.0, 0.4.0, 0.4.0.1) work with the installed vLLM, reversibly."""


@main.command()
@target_options
@click.option("--dry-run", is_flag=True, help="Show what would be applied; write nothing.")
@click.option("--adopt", is_flag=True, help="A file changed since patching (updated upstream) becomes the new "
              "pristine copy and is patched; revert then gives that newer file back.")
@click.option("--allow-partial", is_flag=True,
              help="With --only/--skip: accept an install that lacks patches the installed vLLM needs (exit as verify "
                   "of the chosen patches). At risk: what each left-out patch fixes, named in the output; e.g. "
                   "without SP010, SP012 and SP022 hidden states can be attributed to the wrong request.")
def apply(target, hosts, hosts_file, ssh_config, only, skip, as_json, dry_run, adopt, allow_partial):
    """Rewrite the installed speculators (all-or-nothing, idempotent)."""
    from patcher.commands.apply import apply as verb

    if allow_partial and not (only or skip):
        _usage_error("--allow-partial is only used with --only or --skip: without them every needed patch is applied",
                     as_json)
    _main(hosts, hosts_file, lambda host: run_on_target(
        target, host, ssh_config,
        lambda t, s: verb(t, s, select(only, skip, "requires"), dry_run, adopt, advise=lambda hint: with_target(hint, t),
                          allow_partial=allow_partial),
        lambda t, s, done: reports.apply_report(t, s, done, dry_run)), as_json)


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
        transport = connect(target, host, ssh_config)
        with transport:
            result = engine.repair(transport)
            snap, lines = result.snap, result.lines
            data = {**describe_target(snap), "was": snap.state_problem, "files": lines, "unrestorable": result.unrestorable,
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
                console.print("repaired: the record matches the files" if snap.state_problem or result.dropped
                              else "nothing to repair: the record already matched the files; checked again")

        return Report(data, 1 if result.unrestorable else 0, render)

    _main(hosts, hosts_file, command, as_json)


@main.command()
@target_options
def diff(target, hosts, hosts_file, ssh_config, only, skip, as_json):
    """Print what apply would change as a unified diff; exit 1 when there are changes."""
    from patcher.commands.apply import diff as verb

    _main(hosts, hosts_file, lambda host: run_on_target(
        target, host, ssh_config, lambda t, s: verb(t, s, select(only, skip, "requires")),
        lambda t, s, done: reports.diff_report(t, done)), as_json)


@main.command()
@target_options
def status(target, hosts, hosts_file, ssh_config, only, skip, as_json):
    """Show each file's state and each patch: applied / pending / not needed."""
    from patcher.commands.status import status as verb

    _main(hosts, hosts_file, lambda host: run_on_target(
        target, host, ssh_config, lambda t, s: verb(s, select(only, skip)), reports.status_report), as_json)


@main.command(name="verify")
@target_options
@click.option("--runtime", is_flag=True,
              help="Also import vLLM in the target's interpreter and confirm the call check on the live objects (slow).")
def verify_command(target, hosts, hosts_file, ssh_config, only, skip, as_json, runtime):
    """Check vLLM's API (static read, with evidence) and the patched speculators agree."""
    from patcher.commands.verify import verify as verb

    _main(hosts, hosts_file, lambda host: run_on_target(
        target, host, ssh_config,
        lambda t, s: verb(t, s, select(only, skip), runtime, advise=lambda hint: with_target(hint, t)),
        reports.verify_report), as_json)


@main.command()
@target_options
@click.option("--force", is_flag=True, help="Also restore files modified after patching (their edits are lost).")
@click.option("--dry-run", is_flag=True, help="Show what would be restored; write nothing.")
def revert(target, hosts, hosts_file, ssh_config, only, skip, as_json, force, dry_run):
    """Restore the pristine files byte for byte (or drop only the selected patches)."""
    partial = bool(only or skip)
    from patcher.commands.status import revert as verb

    _main(hosts, hosts_file, lambda host: run_on_target(
        target, host, ssh_config,
        lambda t, s: verb(t, s, select(only, skip, "dependents", s.applied_ids()), partial, force, dry_run,
                          advise=lambda hint: with_target(hint, t)),
        lambda t, s, done: reports.revert_report(s, done, dry_run)), as_json)


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
    from patcher.commands.selftest import request, selftest as verb

    def command(host):
        def run(t, s):
            reports.relay_progress(t, host)
            return verb(t, s, request(archs, model, device, tp, runner), timeout)

        return run_on_target(target, host, ssh_config, run, lambda t, s, report: reports.selftest_report(s, report))

    _main(hosts, hosts_file, command, as_json)


@main.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@patch_file_option
def list_command(as_json):
    """List every patch (shipped, installed packs, --patch-file) with the vLLM fact it depends on."""
    from rich.table import Table

    from patcher.fixes.registry import all_patches
    from patcher.fixes.userpatches.loader import describe, origin_fields

    try:
        _load_patch_files()
        patches = all_patches()
    except UserError as e:
        _usage_error(str(e), as_json)
    rows = [{"id": p.id, "name": p.name, "version": p.version, "file": p.file, "title": p.title,
             **origin_fields(p),
             "facts": [{"symbol": f.symbol, "modules": list(f.modules), "summary": f.summary,
                        "first_release": f.first_release} for f in p.facts], "depends_on": p.depends_on,
             "requires": list(p.requires)}
            for p in sorted(patches, key=lambda p: p.id)]
    users = {p.id: describe(p) for p in patches if p.origin != "shipped"}
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table()
    for col in ("id", "name", "v", "file", "depends on", "requires", *(("origin",) if users else ())):
        table.add_column(col, overflow="fold")
    for r in rows:
        deps = "; ".join(f"{f['symbol']} ({', '.join(f['modules'])}, >= {f['first_release']})" for f in r["facts"])
        origin = (escape(users.get(r["id"], "shipped")),) if users else ()
        table.add_row(r["id"], r["name"], str(r["version"]), r["file"].rsplit("/", 1)[-1], deps or r["depends_on"] or "speculators' own logic",
                      ", ".join(r["requires"]), *origin)
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
    from patcher.fixes.userpatches.template import write

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

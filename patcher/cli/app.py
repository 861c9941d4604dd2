"""The ``speculators-patch`` command line: apply, diff, verify, status, revert, repair, selftest,
list, new -- options, one target or a fan-out over several, exit codes. The verbs themselves
are ``patcher.commands``; what they print, ``patcher.cli.reports`` and ``patcher.cli.render``.

Each click function reads its options once into an ``Options`` (``patcher.cli.options``) and
hands it down with a ``Verb`` (``patcher.cli.run``): named functions that run the
``patcher.commands`` verb on a target and turn its answer into a ``Report``.

Exit codes: 0 success; 1 ``diff`` found changes, ``verify`` found disagreements, ``apply``
left an install that fails verify's checks, ``repair`` found a file nothing kept restores, or
``status`` found the install not patched (``commands.status.Status.exit_code``); 2 bad input or a refused operation (one line on stderr, nothing changed); 3 ``verify`` (and
``apply``): every static check passes, but the installed vLLM release has no engine proof
(``UNPROVEN``); 130 Ctrl-C (one line saying whether anything changed).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import click

import patcher
from patcher.cli import exit_codes, jsontext, reports, say_error
from patcher.cli.options import DEFAULT_JOBS, Advice, Options
from patcher.cli.render import Report, interrupted_message, print_out
from patcher.cli.run import (
    APPLY,
    DIFF,
    REVERT,
    STATUS,
    VERIFY,
    Verb,
    all_hosts,
    check_draft_on,
    repair_on,
    run_on_target,
    run_patches,
    selftest_on,
    worded,
)
from patcher.commands.selftest import ARCHS as SELFTEST_ARCHS
from patcher.errors import Interrupted, UserError, interrupted_exit

if TYPE_CHECKING:
    from patcher.fixes.registry import PatchSet

# The engine, libcst and rich are imported where used, not here: read-only commands on a patched
# install never import libcst, and rich is imported only to render (docs/speed.md). ``--version``
# alone never gets here (``patcher.cli.console`` answers it before click is imported).

# --- Errors: one writer ------------------------------------------------------------------


def fail(message: str, as_json: bool, code: int = 2) -> NoReturn:
    """End the run on a refusal: ``error: MESSAGE`` on stderr, or with ``--json`` the object
    ``{"error", "exit_code"}`` on stdout (``patcher.cli.say_error``); exit ``code``."""
    say_error(message, as_json, code)
    sys.exit(code)


def one_line(text: str) -> str:
    """A refusal's message as one line, whatever the input put in it."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


# --- Options -----------------------------------------------------------------------------


def _one_target(ctx, param, values: tuple[str, ...]) -> str | None:
    """``--target`` given once (or not): a second one is refused rather than silently winning."""
    if len(values) > 1:
        raise click.BadParameter(
            f"given {len(values)} times ({', '.join(values)}): one target per run; several hosts take --host",
            ctx=ctx,
            param=param,
        )
    return values[0] if values else None


def connection_options(f):
    """Where the target is and how to reach it: ``--target``, ``--host``, ``--hosts-file``,
    ``--exec``, ``--jobs``, the SSH options, ``--connect-timeout``, ``--json``, ``--no-cache``."""
    f = click.option(
        "--no-cache",
        is_flag=True,
        help="Compute every answer afresh: read and write nothing in this user's cache "
        "(~/.cache/speculators-patch/fast) and use no record of an earlier run's checks.",
    )(f)
    f = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(f)
    f = click.option(
        "--connect-timeout",
        type=click.FloatRange(1, 3600),
        metavar="SECONDS",
        envvar="SPECULATORS_PATCH_CONNECT_TIMEOUT",
        help="Give up when the target's agent has not started within this time: the SSH connection, "
        "the --exec command, the interpreter (default 30).",
    )(f)
    f = click.option("--ssh-config", metavar="FILE", help="OpenSSH config file to use (like ssh -F).")(f)
    f = click.option(
        "--ssh-persist",
        type=click.IntRange(0, 86400),
        metavar="SECONDS",
        envvar="SPECULATORS_PATCH_SSH_PERSIST",
        help="Keep each host's SSH connection open this long after a run, for the next run to "
        "reuse (default 60; 0: a new connection every run). Off where your ssh_config "
        "sets ControlPath or ControlMaster.",
    )(f)
    f = click.option(
        "--jobs",
        type=click.IntRange(1, 256),
        default=DEFAULT_JOBS,
        show_default=True,
        help="With several hosts: how many to work on at once.",
    )(f)
    f = click.option(
        "--exec",
        "exec_commands",
        multiple=True,
        metavar="'CMD ...'",
        help="Run on the Python this command starts, e.g. 'docker exec -i NAME python3' or "
        "'kubectl exec -i POD -- python3' (argument vector, no shell); repeatable.",
    )(f)
    f = click.option("--hosts-file", type=click.Path(dir_okay=False), help="File with one host per line.")(f)
    f = click.option(
        "--host",
        "hosts",
        multiple=True,
        metavar="HOST",
        help="Remote machine: an ~/.ssh/config alias or [user@]host[:port]; repeatable.",
    )(f)
    f = click.option(
        "--target",
        metavar="PATH",
        multiple=True,
        callback=_one_target,
        help="venv/conda prefix, site-packages directory or Python interpreter (default: active env).",
    )(f)
    return f


def patch_file_option(f):
    """``--patch-file FILE`` (repeatable): a user patch, loaded by ``_main`` before anything else."""
    return click.option(
        "--patch-file",
        "patch_files",
        multiple=True,
        metavar="FILE",
        help="Also use the patch this Python file defines (PATCH = Patch(...)); repeatable.",
    )(f)


def timeout_option(f):
    """``--timeout SECONDS``: the longest wait for each answer of the target's agent."""
    return click.option(
        "--timeout",
        type=click.FloatRange(1, 86400),
        metavar="SECONDS",
        envvar="SPECULATORS_PATCH_TIMEOUT",
        help="Give up when the target's agent does not answer a request within this time "
        "(default 600), waiting for another run's lock included; a commit that holds the lock "
        "is waited for 60 s more, and ended past that.",
    )(f)


def target_options(f):
    """Every option of a verb that works on targets with the patch choice (``--only``, ``--skip``)."""
    f = click.option("--skip", multiple=True, metavar="ID", help="Leave out this patch (id or name); repeatable.")(f)
    f = click.option("--only", multiple=True, metavar="ID", help="Only this patch (id or name); repeatable.")(f)
    return timeout_option(patch_file_option(connection_options(f)))


def read_options(ctx: click.Context, params: dict[str, Any], **more: Any) -> Options:
    """This run's ``Options``, from the click function's parameters (``more``: values that
    are not options of its own, such as selftest's wait for the agent)."""
    known = {
        k: tuple(v) if isinstance(v, (list, tuple)) else v
        for k, v in params.items()
        if k in Options.__dataclass_fields__
    }
    given = ctx.get_parameter_source("ssh_persist") == click.core.ParameterSource.COMMANDLINE
    return Options(**known, ssh_persist_given=given, **more)


def _seconds(variable: str) -> float | None:
    """``$variable`` as seconds between 1 and 86400 (None when unset); ``UserError`` otherwise."""
    text = os.environ.get(variable)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 86400:
        raise UserError(f"${variable} is {text!r}: expected seconds between 1 and 86400")
    return value


# --- One run: its target or hosts, its answer --------------------------------------------


def _main(opts: Options, command: Callable[[PatchSet, str | None], Report]) -> NoReturn:
    """Run ``command(patches, host)`` with this run's patches (``run_patches``) on the local
    target or one host; several hosts go to ``patcher.cli.fanout``. Prints the report (or
    the refusal), its ways out said for its host (``worded``), and exits with its code."""
    from patcher import cache

    report = None
    try:
        with cache.switched_off(opts.no_cache):  # --no-cache: the option, for this command only
            command = worded(opts, functools.partial(command, run_patches(opts)))
            hosts = all_hosts(opts)
            if len(hosts) > 1:
                from patcher.cli.fanout import run_many

                sys.exit(
                    run_many(hosts, command, opts.as_json, opts.jobs, lambda h, text: Advice(opts, h).render(text))
                )
            report = command(hosts[0] if hosts else None)
        _emit(report, opts.as_json)
    except KeyboardInterrupt:  # while the answer was printed too: what the run wrote stands
        fail(interrupted_message(report.written if report else []), opts.as_json, interrupted_exit())
    except Interrupted as e:  # during a commit: what became of it
        fail(str(e), opts.as_json, interrupted_exit())
    except UserError as e:
        fail(one_line(str(e)), opts.as_json)
    sys.exit(report.exit_code)


def _emit(report: Report, as_json: bool) -> None:
    if as_json:
        click.echo(jsontext.dumps({**report.data, "notes": report.notes, "exit_code": report.exit_code}, indent=1))
    else:
        if report.notes:
            from rich.console import Console

            for note in report.notes:
                Console(stderr=True, highlight=False, soft_wrap=True).print(f"note: {note}")
        print_out(report.render, report.say)


def run_verb(opts: Options, verb: Verb) -> NoReturn:
    """``verb`` on this run's target or hosts (``run_on_target`` for each)."""
    _main(opts, functools.partial(run_on_target, opts, verb))


# --- The click entry points ----------------------------------------------------------------


class _Group(click.Group):
    """Usage errors as one ``error:`` line (exit 2), like every other refusal; and a closed
    standard output is refused before anything is read or written."""

    def main(self, *args, **kwargs):  # type: ignore[override]
        try:
            os.fstat(1)
        except OSError:
            fail("standard output is closed; nothing was done", False)
        argv = list(args[0] if args else kwargs.get("args") or sys.argv[1:])
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:  # no command given: the help, as click prints it
            click.echo(e.ctx.get_help() if e.ctx else e.format_message())
            sys.exit(2)
        except click.UsageError as e:
            hint = f" (see {e.ctx.command_path} --help)" if e.ctx else ""
            fail(f"{e.format_message()}{hint}".replace("\n", " "), "--json" in argv)
        except click.ClickException as e:
            fail(e.format_message().replace("\n", " "), "--json" in argv)
        except click.Abort:  # Ctrl-C before a command ran (during ones, ``_main`` answers)
            fail(interrupted_message(), False, interrupted_exit())


class _AttributionHelp(click.Option):
    """An option whose help names, in place of ``{attribution}``, the shipped patches without
    which hidden states can be attributed to the wrong request (``CheckHooks.attribution``): read
    from the patch set only when the help is shown, so no other command loads it for this."""

    @property
    def help(self) -> str | None:
        text = self.__dict__.get("_help")
        if not text or "{attribution}" not in text:
            return text
        from patcher.fixes.registry import shipped_patches

        ids = sorted(p.id for p in shipped_patches() if p.checks.attribution)
        named = " and ".join(filter(None, [", ".join(ids[:-1]), *ids[-1:]]))
        return text.replace("{attribution}", named)

    @help.setter
    def help(self, value: str | None) -> None:
        self.__dict__["_help"] = value


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(patcher.__version__, prog_name="speculators-patch")
def main() -> None:
    """Make an installed speculators (0.3.0, 0.4.0, 0.4.0.1) work with the installed vLLM, reversibly."""


@main.command()
@target_options
@click.option("--dry-run", is_flag=True, help="Show what would be applied; write nothing.")
@click.option(
    "--adopt",
    is_flag=True,
    help="A file changed since patching (updated upstream) becomes the new "
    "pristine copy and is patched; revert then gives that newer file back.",
)
@click.option(
    "--allow-partial",
    cls=_AttributionHelp,
    is_flag=True,
    help="With --only/--skip: accept an install that lacks patches the installed vLLM needs (exit as verify "
    "of the chosen patches). At risk: what each left-out patch fixes, named in the output; e.g. "
    "without {attribution} hidden states can be attributed to the wrong request.",
)
@click.pass_context
def apply(ctx: click.Context, **params: Any) -> None:
    """Rewrite the installed speculators (all-or-nothing, idempotent)."""
    opts = read_options(ctx, params)
    if opts.allow_partial and not (opts.only or opts.skip):
        fail(
            "--allow-partial is only used with --only or --skip: without them every needed patch is applied",
            opts.as_json,
        )
    run_verb(opts, APPLY)


@main.command()
@connection_options
@patch_file_option
@timeout_option
@click.pass_context
def repair(ctx: click.Context, **params: Any) -> None:
    """Rebuild a damaged or lost record from the files and the verified pristine copies."""
    opts = read_options(ctx, params)
    _main(opts, functools.partial(repair_on, opts))


@main.command()
@target_options
@click.pass_context
def diff(ctx: click.Context, **params: Any) -> None:
    """Print what apply would change as a unified diff; exit 1 when there are changes."""
    run_verb(read_options(ctx, params), DIFF)


@main.command()
@target_options
@click.pass_context
def status(ctx: click.Context, **params: Any) -> None:
    """Show each file's state and each patch: applied / pending / not needed."""
    run_verb(read_options(ctx, params), STATUS)


@main.command(name="verify")
@target_options
@click.option(
    "--runtime",
    is_flag=True,
    help="Also import vLLM in the target's interpreter and confirm the call check on the live objects (slow).",
)
@click.pass_context
def verify_command(ctx: click.Context, **params: Any) -> None:
    """Check vLLM's API (static read, with evidence) and the patched speculators agree."""
    run_verb(read_options(ctx, params), VERIFY)


@main.command()
@target_options
@click.option("--force", is_flag=True, help="Also restore files modified after patching (their edits are lost).")
@click.option("--dry-run", is_flag=True, help="Show what would be restored; write nothing.")
@click.pass_context
def revert(ctx: click.Context, **params: Any) -> None:
    """Restore the pristine files byte for byte (or drop only the selected patches)."""
    run_verb(read_options(ctx, params), REVERT)


@main.command()
@connection_options
@click.option(
    "--arch",
    "archs",
    multiple=True,
    type=click.Choice(SELFTEST_ARCHS),
    help="Architecture to build and check; repeatable (default: llama, plus --model's).",
)
@click.option(
    "--model",
    metavar="PATH",
    help="A real model's directory or config.json on the target: a tiny model of its architecture is checked too.",
)
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("--tp", type=click.IntRange(1, 64), default=1, show_default=True, help="Tensor parallel size.")
@click.option(
    "--runner",
    type=click.Choice(["auto", "v1", "v2", "both"]),
    default="auto",
    show_default=True,
    help="GPU model runner: vLLM's own choice, V1, Model Runner V2, or one run with each.",
)
@click.option(
    "--serve/--no-serve",
    default=None,
    help="Serve each trained draft with vLLM as EAGLE-3 and report its acceptance (default: on a GPU only).",
)
@click.option(
    "--timeout",
    "limit",
    type=click.IntRange(60, 86400),
    default=3600,
    show_default=True,
    metavar="SECONDS",
    help="Give up when the whole run (every --arch: extraction, training, serving) has not finished within this "
    "time: its processes on the target are stopped, one error line, exit 2.",
)
@click.pass_context
def selftest(
    ctx: click.Context,
    archs: tuple[str, ...],
    model: str | None,
    device: str,
    tp: int,
    runner: str,
    serve: bool | None,
    limit: int,
    **params: Any,
) -> None:
    """Prove extraction on this box: speculators' generator vs transformers on tiny models."""
    from patcher.commands.selftest import request

    as_json = params["as_json"]
    try:  # its --timeout is its own run's; $SPECULATORS_PATCH_TIMEOUT still bounds each exchange
        opts = read_options(ctx, params, timeout=_seconds("SPECULATORS_PATCH_TIMEOUT"))
        asked = request(archs, model, device, tp, runner, serve)
    except UserError as e:
        fail(one_line(str(e)), as_json)
    _main(opts, functools.partial(selftest_on, opts, asked, limit))


@main.command(name="check-draft")
@click.argument("draft", metavar="DRAFT_DIR")
@click.option(
    "--data-config",
    metavar="PATH",
    help="The training data's data_config.json (or the directory holding it): compare the draft's "
    "auxiliary layers with the layers its data holds.",
)
@click.option(
    "--verifier",
    metavar="PATH",
    help="The verifier vLLM will serve the draft with (default: the one the draft's config names).",
)
@connection_options
@timeout_option
@click.pass_context
def check_draft_command(
    ctx: click.Context, draft: str, data_config: str | None, verifier: str | None, **params: Any
) -> None:
    """Say whether the installed vLLM serves a saved EAGLE-3 draft on the hidden states it was trained on.

    Reads the draft directory (speculators' config.json and weights), its verifier and vLLM's
    source on the target.
    """
    opts = read_options(ctx, params)
    _main(opts, functools.partial(check_draft_on, opts, draft, data_config, verifier))


@main.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@patch_file_option
@click.pass_context
def list_command(ctx: click.Context, **params: Any) -> None:
    """List every patch (shipped, installed packs, --patch-file) with the vLLM fact it depends on."""
    from patcher.commands.listing import listing

    opts = read_options(ctx, params)
    try:
        done = listing(run_patches(opts))
    except UserError as e:
        fail(str(e).replace("\n", " "), opts.as_json)
    if opts.as_json:
        click.echo(jsontext.dumps(done.rows, indent=1))
    else:
        print_out(reports.list_report(done).render)


@main.command()
@click.argument("patch_id", metavar="ID")
@click.option(
    "--file",
    "file",
    required=True,
    metavar="speculators/....py",
    help="The speculators file the patch rewrites, relative to site-packages.",
)
@click.option(
    "-o", "--output", required=True, metavar="FILE.py", help="Where to write the patch (its test goes next to it)."
)
@click.option("--speculators", default="0.3.0", show_default=True, help="The speculators release it is written for.")
@click.option("--force", is_flag=True, help="Overwrite existing files.")
def new(patch_id, file, output, speculators, force):
    """Write a commented patch file to start a fix from, and its pytest file."""
    from patcher.fixes.userpatches.template import write

    try:
        patch_path, test_path = write(patch_id, file, output, speculators, force)
    except UserError as e:
        fail(str(e), False)
    import importlib.util
    import shlex

    python = shlex.quote(sys.executable)
    run_tests = f"`{python} -m pytest {shlex.quote(str(test_path))}` (the Python speculators-patch runs in)"
    try:
        has_pytest = importlib.util.find_spec("pytest") is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as none
        has_pytest = False
    if not has_pytest:  # `pip install .` brings no pytest
        run_tests = (
            f"`{python} -m pip install pytest` (the Python speculators-patch runs in has none), then "
            f"`{python} -m pytest {shlex.quote(str(test_path))}`"
        )
    click.echo(
        f"wrote {patch_path} and {test_path}\n"
        f"next: edit both, {run_tests}, then "
        f"`speculators-patch diff --patch-file {shlex.quote(str(patch_path))} --target ...`"
    )


for _name, _command in main.commands.items():  # every verb's --help ends with its exit codes
    _command.epilog = exit_codes.epilog(_name)

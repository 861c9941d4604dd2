"""The command line: ``app`` (the click entry points, one target or a fan-out, exit codes),
``options`` (the run's ``Options`` and the advice worded with them), ``run`` (one verb on one
target), ``reports`` (each verb's data as printed), ``render`` (console, tables), ``fanout``
(several hosts); ``say_error`` here, the one writer of a refusal.

``console`` is the ``speculators-patch`` script; ``main`` (the click group) and ``Report`` are
imported on first use, so that importing this package is instant and a Ctrl-C while the command
line is still loading is answered in one line, like one at any later moment."""

import sys  # already loaded: importing this package runs nothing a Ctrl-C could interrupt mid-way

__all__ = ["Report", "console", "main", "say_error"]

# The exit code after Ctrl-C while the command line loads (later: ``errors.interrupted_exit``).
_INTERRUPTED = 130


_LOADING = "interrupted ({}) before anything was written: nothing changed"


def say_error(message: str, as_json: bool, code: int) -> None:
    """The one writer of a refusal or an interruption, for every command and every moment:
    ``error: MESSAGE`` on stderr, or with ``--json`` the object ``{"error", "exit_code"}``
    on stdout. Standard library only: a Ctrl-C while click is still being imported uses it.
    A way out the run did not word for its target is said plainly here (``patcher.ways``), never
    as its token."""
    from patcher import ways

    message = ways.render(message)
    if as_json:
        from patcher.cli import jsontext

        sys.stdout.write(jsontext.dumps({"error": message, "exit_code": code}) + "\n")
        sys.stdout.flush()
    else:
        sys.stderr.write(f"error: {message}\n")
        sys.stderr.flush()


def _say_interrupted(message: str) -> None:
    """The one line a Ctrl-C (SIGTERM, SIGHUP) gets (``say_error``; as JSON with ``--json``)."""
    from patcher.errors import interrupted_exit

    say_error(message, "--json" in sys.argv[1:], interrupted_exit())


def _interrupted_while_loading(signum, frame) -> None:
    """SIGINT (SIGTERM, SIGHUP) while the command line is imported: nothing has been read or
    written, so the process ends at once, in one line (a KeyboardInterrupt raised inside an
    import can be swallowed by the import machinery's callbacks, and the command would then
    run on)."""
    import os
    import signal

    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    say_error(_LOADING.format(name), "--json" in sys.argv[1:], 128 + signum)
    os._exit(128 + signum)


def console() -> None:
    """The ``speculators-patch`` console script: ``main``, and Ctrl-C at any moment one line
    (exit 130) -- while click and rich are still being imported too. ``--version`` alone is
    answered before any of them is imported, in click's own words (``version_option``)."""
    if sys.argv[1:] == ["--version"]:
        from patcher import __version__

        sys.stdout.write(f"speculators-patch, version {__version__}\n")
        return
    import signal

    loading = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not where SIGINT is ignored
    if loading:
        signal.signal(signal.SIGINT, _interrupted_while_loading)
    # A kill or a closed terminal ends the run as Ctrl-C does, in one line (not where ignored).
    stoppers = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is signal.SIG_DFL]
    for stopper in stoppers:
        signal.signal(stopper, _interrupted_while_loading)
    try:
        from patcher.cli.app import main as group
    except KeyboardInterrupt:  # where our handler could not be set (SIGINT not at its default)
        _say_interrupted(_LOADING.format("Ctrl-C"))
        raise SystemExit(_INTERRUPTED) from None
    finally:
        if loading:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    from patcher.errors import interrupted_exit, interruption, stop_on_signal

    for stopper in stoppers:
        signal.signal(stopper, stop_on_signal)
    try:
        group()
    except KeyboardInterrupt:  # outside what the commands answer themselves (they exit first)
        render = sys.modules.get("patcher.cli.render")
        _say_interrupted(render.interrupted_message() if render else _LOADING.format(interruption()))
        raise SystemExit(interrupted_exit()) from None
    finally:  # answered, exit code set: a signal while the interpreter shuts down changes nothing
        for stopped in (signal.SIGINT, *stoppers):
            signal.signal(stopped, signal.SIG_IGN)
        # Under ``python -m``, CPython ends a process by SIGINT (exit -2, not our 130) when the last
        # exec()/eval() of a string was left by a KeyboardInterrupt, caught or not (pythonrun.c
        # run_eval_code_obj sets _Py_UnhandledKeyboardInterrupt, Modules/main.c Py_RunMain reads it;
        # a Ctrl-C inside a dataclass's generated code while a module loads does that). Each such
        # eval clears the flag first: this one leaves it clear.
        eval("0")


def __getattr__(name: str):
    """``main`` (the click group) and ``Report``, imported on first use (PEP 562)."""
    if name == "main":
        from patcher.cli.app import main

        return main
    if name == "Report":
        from patcher.cli.render import Report

        return Report
    raise AttributeError(f"module 'patcher.cli' has no attribute {name!r}")

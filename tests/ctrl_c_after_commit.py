"""``speculators-patch ARGS`` with a Ctrl-C after ``apply``'s commit (``tests/test_messages.py``):
where ``verify``'s call check starts (``CTRL_C_AT=verify``, the default), as the report is
printed (``CTRL_C_AT=print``) or, over several hosts, as the summary is (``CTRL_C_AT=summary``)."""

import os
import signal
import sys

import patcher.checks.verify as checks
from patcher.cli import app, console, fanout

signal.signal(signal.SIGINT, signal.default_int_handler)
where = os.environ.get("CTRL_C_AT", "verify")
module, name = {"verify": (checks, "verify_calls"), "print": (app, "_emit"), "summary": (fanout, "summary_table")}[
    where
]
real = getattr(module, name)


def interrupted(*args, **kwargs):
    # The Ctrl-C lands inside code run by exec() of a string, as one can inside a dataclass's
    # generated methods while a module loads: run as ``python -m ctrl_c_after_commit``, CPython
    # then exits by SIGINT unless the CLI clears that (patcher/cli/__init__.py ``console``).
    exec("os.kill(os.getpid(), signal.SIGINT)")
    return real(*args, **kwargs)


setattr(module, name, interrupted)
sys.argv[0] = "speculators-patch"
console()

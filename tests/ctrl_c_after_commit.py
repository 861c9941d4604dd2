"""``speculators-patch ARGS`` with a Ctrl-C after ``apply``'s commit (``tests/test_messages.py``):
where ``verify``'s call check starts (``CTRL_C_AT=verify``, the default) or as the report is
printed (``CTRL_C_AT=print``)."""

import os
import signal
import sys

import patcher.checks.verify as checks
from patcher.cli import app, console

signal.signal(signal.SIGINT, signal.default_int_handler)
where = os.environ.get("CTRL_C_AT", "verify")
module, name = (checks, "verify_calls") if where == "verify" else (app, "_emit")
real = getattr(module, name)


def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)


setattr(module, name, interrupted)
sys.argv[0] = "speculators-patch"
console()

"""``speculators-patch ARGS`` with a Ctrl-C where ``verify``'s call check starts: for ``apply``,
after its commit (``tests/test_messages.py``)."""

import os
import signal
import sys

import patcher.checks.verify as checks
from patcher.cli import console

signal.signal(signal.SIGINT, signal.default_int_handler)
real = checks.verify_calls


def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)


checks.verify_calls = interrupted
sys.argv[0] = "speculators-patch"
console()

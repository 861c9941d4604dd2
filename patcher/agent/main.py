"""The agent's entry point: one JSON request per line on stdin, one JSON answer per line."""

from __future__ import annotations

import json
import os
import sys

from .commit import commit, forget, repair
from .common import AgentError
from .draft import draft
from .inspect import inspect
from .run_python import run_python
from .sources import sources

HANDLERS = {
    "inspect": inspect,
    "commit": commit,
    "repair": repair,
    "forget": forget,
    "sources": sources,
    "run_python": run_python,
    "draft": draft,
}


def handle(message):
    """Dispatch one request dict ``{"op": ..., ...}``; return ``{"ok": ...}`` or ``{"error": ...}``.
    ``"then": [request, ...]``: run each after this one succeeded, in order, answered in
    the same line as ``"then": [answer, ...]`` (``apply``'s verdict check rides on its
    commit: no extra round trip). An unexpected failure is answered as one line too
    (never a traceback on the wire)."""
    answer = _handle_one(message)
    if "ok" in answer and isinstance(message.get("then"), list):
        answer["then"] = [
            _handle_one(m) if isinstance(m, dict) else {"error": "not a request"} for m in message["then"]
        ]
    return answer


def _handle_one(message):
    try:
        return {"ok": HANDLERS[message["op"]](message)}
    except AgentError as e:
        return {"error": str(e)}
    except OSError as e:
        return {"error": "%s: %s" % (e.filename or message.get("op"), e.strerror or e)}
    except Exception as e:  # a bug or a request this agent does not understand
        return {"error": "the agent failed on %s: %s: %s" % (message.get("op"), type(e).__name__, e)}


SITE_PACKAGES = "--site-packages="


def main(argv=None):
    """Read one JSON request per line on stdin, answer one JSON line each, until EOF.

    Arguments (``argv``, default ``sys.argv[1:]``): the marker to print first (the agent is
    started as ``python -c PROGRAM MARKER``, locally or by the bootstrap: the line says it
    runs, the handshake the caller times), and ``--site-packages=DIR`` for
    a bare site-packages target (every request without one then names DIR)."""
    args = sys.argv[1:] if argv is None else argv
    # ``python -c``/``python -`` put the working directory first on sys.path: a
    # ``speculators`` directory there must not decide which tree is patched.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    site_dir = next((a[len(SITE_PACKAGES) :] for a in args if a.startswith(SITE_PACKAGES)), None)
    for arg in args:
        if arg.startswith("speculators-patch-agent-"):
            sys.stdout.write("\n" + arg + "\n")
            sys.stdout.flush()
    for line in sys.stdin:
        if line.strip():
            try:
                message = json.loads(line)
            except ValueError:
                message = {"op": None}
            if site_dir is not None and isinstance(message, dict) and not message.get("site_packages"):
                message["site_packages"] = site_dir
            sys.stdout.write(json.dumps(handle(message)) + "\n")
            sys.stdout.flush()

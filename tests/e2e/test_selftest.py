"""``speculators-patch selftest`` on the real vLLM CPU engines: the harness users run is the
one this tier trusts.

Each fixture runs the real CLI once per session on a target venv (real speculators 0.3.0
wheel, patched or not by the real CLI, with an engine env's packages) and keeps its JSON.
What a user checks: exit code 0 only when every capture is within the bound; exit 1 with
the figures when captures are silently wrong; exit 1 with the generator's own error (and
the patch that fixes it) when it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support import API_FIXES_ONLY, skipping
from targets import (
    ROOT,
    SELFTEST_TIMEOUT,
    assert_all_within_bound,
    cli,
    engine_environ,
    install_patched_on_016_moved_to,
    patched_target,
    selftest,
)

from patcher.agent.selftest import serve

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]


@pytest.fixture(scope="session")
def all_archs_016(target_016):
    return selftest(target_016, "--arch", "llama", "--arch", "deepseek_v3", "--arch", "kimi_k25")


@pytest.fixture(scope="session")
def all_archs_018(tmp_path_factory):
    target = patched_target(tmp_path_factory, "0.18.1")
    return selftest(target, "--arch", "llama", "--arch", "deepseek_v3", "--arch", "kimi_k25", vllm="0.18.1")


def test_selftest_passes_on_patched_016(all_archs_016):
    assert_all_within_bound(*all_archs_016, ["llama", "deepseek_v3", "kimi_k25"])


def test_selftest_passes_on_patched_032(all_archs_032):
    """vLLM 0.32.0's CPU engine: torch 2.13.0, transformers 5.19.0 (SP014, SP019, SP030-SP032)."""
    assert_all_within_bound(*all_archs_032, ["llama", "deepseek_v3", "kimi_k25"])


@pytest.mark.newer_engine
def test_selftest_passes_on_patched_018(all_archs_018):
    assert_all_within_bound(*all_archs_018, ["llama", "deepseek_v3", "kimi_k25"])


def test_selftest_on_the_cpu_serves_nothing_unless_asked(all_archs_016):
    """Nothing is trained on the CPU (no FlexAttention backward): the serving stage says so
    and the verdict names the option that runs it."""
    code, data, _ = all_archs_016
    for arch in data["selftest"]["archs"]:
        assert arch["serving"] == {"skipped": serve.NOT_ON_CPU, "ok": True}
    assert data["summary"].endswith("; no draft served by vLLM (on the CPU only with --serve)")


def test_selftest_serve_has_the_cpu_engine_serve_the_saved_draft(tmp_path_factory):
    """--serve on the CPU: vLLM 0.32.0's CPU engine (the first CPU engine here with speculative
    decoding) loads the draft the training stage saved as the tiny verifier's EAGLE-3
    speculator (the README's form) and runs draft steps with it; the draft is served the
    captured layers + 1 (vLLM's numbering), whatever it records."""
    target = patched_target(tmp_path_factory, "0.32.0")
    code, data, stderr = selftest(target, "--arch", "llama", "--serve", vllm="0.32.0")
    arch = data["selftest"]["archs"][0]
    serving = arch["serving"]
    assert code == 0 and serving["ok"], serving.get("error") or stderr[-2000:]
    assert serving["aux_layer_ids"]["served"] == [i + 1 for i in arch["layers"]] == [1, 4, 6]
    assert serving["aux_layer_ids"]["recorded"] in (None, [1, 4, 6])
    assert list(serving["drafts"]) == ["trained"]  # no untrained twin: nothing is trained on the CPU
    trained = serving["drafts"]["trained"]
    assert trained["drafts"] > 0 and trained["acceptance_length"] >= 1.0
    assert trained["output_tokens"] == serve.PROMPTS * serve.MAX_TOKENS
    assert data["summary"].endswith(
        f"; 1 of 1 served by vLLM as EAGLE-3 (acceptance length {trained['acceptance_length']})"
    )


@pytest.mark.slow  # an engine too old to serve; 0.32.0's serving runs in make test
def test_selftest_serve_on_an_engine_without_speculative_decoding_names_vllms_reason(target_016):
    """vLLM 0.16.0's CPU worker has no speculative decoding: --serve fails (exit 1) with the
    exception vLLM's engine process logged, not only its 'Engine core initialization failed'."""
    code, data, _ = selftest(target_016, "--arch", "llama", "--serve")
    serving = data["selftest"]["archs"][0]["serving"]
    assert code == 1 and not serving["ok"] and data["selftest"]["archs"][0]["training"]["ok"]
    worker = serving["error"]["worker"]
    assert (worker["type"], worker["message"]) == ("AssertionError", "spec decode is not supported."), worker
    assert worker["frames"][-1].split(" in ")[0].endswith("vllm/v1/worker/cpu_model_runner.py:25")


def test_selftest_names_the_runner_and_attention_vllm_built(all_archs_016):
    """What the CPU engine builds, asked of the workers themselves: the V1 runner's CPU
    subclass and the CPU attention backend (TRITON_ATTN/FLASH_ATTN/MLA ones on GPUs)."""
    for arch in all_archs_016[1]["selftest"]["archs"]:
        engine = arch["engine"]
        assert arch["runner"] == "auto" and engine["runner_kind"] == "v1", engine
        assert engine["runner"] == "vllm.v1.worker.cpu_model_runner.CPUModelRunner" and engine["agree"]
        assert engine["attention"] == ["CPU_ATTN"], engine


def test_selftest_refuses_model_runner_v2_on_cpu(target_016):
    proc = cli("selftest", "--target", str(target_016), "--runner", "both", env=engine_environ("0.16.0"), timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: local: selftest cannot run here: --runner both: vLLM's CPU worker builds the V1 model runner up to 0.33"
    ]


def test_a_worker_that_dies_at_start_is_reported_with_its_own_exception(target_016):
    """vLLM itself says only 'WorkerProc initialization failed ...'; the report carries the
    worker's exception. A real worker death: the CPU worker cannot bind OpenMP to core 99."""
    code, data, _ = selftest(target_016, "--arch", "llama", env={"VLLM_CPU_OMP_THREADS_BIND": "99"})
    error = data["selftest"]["archs"][0]["error"]
    assert code == 1 and error["stage"] == "start"
    assert "WorkerProc initialization failed" in error["message"]
    worker = error["worker"]
    assert (worker["type"], worker["message"]) == ("RuntimeError", "Failed to parse CPU string: 99")
    assert any("vllm/v1/worker/cpu_worker.py:" in f and f.endswith(" in init_device") for f in worker["frames"])
    shown = cli(
        "selftest",
        "--target",
        str(target_016),
        "--arch",
        "llama",
        timeout=SELFTEST_TIMEOUT,
        env={**engine_environ("0.16.0"), "VLLM_CPU_OMP_THREADS_BIND": "99"},
    ).stdout
    assert "RuntimeError: Failed to parse CPU string: 99" in shown and "vLLM reported: Exception: WorkerProc" in shown


@pytest.mark.slow  # tp 2 on the CPU: test_engine's llama-tp2 runs in make test
def test_selftest_tensor_parallel_2(tmp_path_factory, target_016):
    code, data, stderr = selftest(target_016, "--arch", "deepseek_v3", "--tp", "2")
    assert_all_within_bound(code, data, stderr, ["deepseek_v3"])
    assert data["selftest"]["archs"][0]["tp"] == 2
    engine = data["selftest"]["archs"][0]["engine"]
    assert engine["ranks"] == 2 and engine["agree"] and engine["capturing_ranks"] == [0]  # rank 0 alone captures
    assert data["selftest"]["environment"]["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"


@pytest.mark.slow  # the API-fixes-only corruption: test_engine's api_fixes_only test runs in make test
def test_selftest_fails_with_figures_when_only_api_fixes_are_applied(tmp_path_factory):
    """0.3.0's own capture logic on a chunked batch: runs, raises nothing, wrong data."""
    target = patched_target(tmp_path_factory, "0.16.0", *skipping(API_FIXES_ONLY))
    code, data, _ = selftest(target)
    report = data["selftest"]
    assert code == 1 and not report["ok"]
    llama = report["archs"][0]
    assert "error" not in llama
    chunked = next(c for c in llama["cases"] if c["case"] == "chunked")
    assert chunked["bad"] and min(layer["worst"] for layer in chunked["layers"]) < 0.5
    assert report["bad_captures"] == len(chunked["bad"]) + sum(
        len(c["bad"]) for c in llama["cases"] if c["case"] != "chunked"
    )


def test_selftest_fails_with_the_real_error_when_unpatched(tmp_path_factory):
    target = patched_target(tmp_path_factory, "0.16.0", "--none")
    code, data, _ = selftest(target)
    error = data["selftest"]["archs"][0]["error"]
    assert code == 1
    assert error["type"] == "ValidationError" and "is_encoder_decoder" in error["message"]
    assert error["patch"] == "SP001"


def test_selftest_over_ssh_gives_the_local_figures_and_leaves_nothing(target_016, all_archs_016, sshd, ssh_config):
    proc = cli(
        "selftest",
        "--host",
        "gpu-box",
        "--target",
        str(target_016),
        "--arch",
        "llama",
        "--json",
        "--ssh-config",
        str(ssh_config),
        timeout=SELFTEST_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)["selftest"]
    remote, local = report["archs"][0], all_archs_016[1]["selftest"]["archs"][0]
    assert [c["layers"] for c in remote["cases"]] == [c["layers"] for c in local["cases"]]
    assert "llama: starting vLLM" in proc.stderr  # progress relayed as it happens
    assert report["workdir"].startswith(tempfile.gettempdir()) and not Path(report["workdir"]).exists()


def test_interrupted_selftest_removes_its_directory(target_016, tmp_path):
    # The target's temp dir is this test's own (TMPDIR reaches the target's interpreter), so
    # other selftests running on the machine cannot blur the check.
    proc = subprocess.Popen(
        [sys.executable, "-m", "patcher", "selftest", "--target", str(target_016)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # as a shell starts it
    deadline = time.monotonic() + 300
    for line in iter(proc.stderr.readline, b""):
        if b"starting vLLM" in line or time.monotonic() > deadline:
            break
    during = list(tmp_path.glob("speculators-patch-selftest-*"))
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
    proc.wait(timeout=120)
    assert during, "selftest did not create its temporary directory"
    assert proc.returncode != 0
    assert list(tmp_path.glob("speculators-patch-selftest-*")) == []


@pytest.mark.parametrize("vllm", ["0.32.0", pytest.param("0.18.1", marks=pytest.mark.newer_engine)])
def test_selftest_names_the_kimi_failure_verify_used_to_miss(tmp_path_factory, vllm):
    """vLLM 0.18+ gives the wrappers SupportsEagle3; without SP008's lookup the worker reaches
    for ``model.model`` on KimiK25ForConditionalGeneration. selftest shows the real error."""
    target = patched_target(tmp_path_factory, vllm, "--skip", "SP008")
    code, data, _ = selftest(target, "--arch", "kimi_k25", vllm=vllm)
    error = data["selftest"]["archs"][0]["error"]
    assert code == 1 and error["stage"] == "start"
    assert "'KimiK25ForConditionalGeneration' object has no attribute 'model'" in error["message"]
    assert error["patch"] == "SP008"


@pytest.mark.slow  # a --model config's rope and routing kept: one engine start of its own
def test_selftest_model_config_keeps_yarn_and_routing(tmp_path, target_016):
    """``--model`` with a Kimi-K2.5-shaped config.json (YaRN factor 32, llama_4_scaling,
    noaux_tc routing, 61 layers of 7168): a tiny model of that architecture with those settings."""
    text = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "first_k_dense_replace": 1,
        "n_routed_experts": 384,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "routed_scaling_factor": 2.827,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "max_position_embeddings": 262144,
        "rope_scaling": {
            "type": "yarn",
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "llama_4_scaling": {"original_max_position_embeddings": 8192, "beta": 0.1},
    }
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text}
        )
    )
    code, data, stderr = selftest(target_016, "--arch", "kimi_k25", "--model", str(tmp_path))
    assert_all_within_bound(code, data, stderr, ["kimi_k25"])
    model = data["selftest"]["archs"][0]["model"]
    assert model["rope_scaling"]["factor"] == 32.0 and model["llama_4_scaling"]["beta"] == 0.1
    assert model["hidden_size"] == 128 and model["kv_lora_rank"] == 64


def test_selftest_model_with_unsupported_architecture_is_bad_input(tmp_path, target_016):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
    proc = cli("selftest", "--target", str(target_016), "--model", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "MixtralForCausalLM" in lines[0]


@pytest.mark.newer_engine
def test_install_patched_on_016_runs_unchanged_on_018(tmp_path_factory, target_016):
    """The patches are portable: still extracting correctly after an upgrade to 0.18.1."""
    target = install_patched_on_016_moved_to(tmp_path_factory, target_016, "0.18.1")
    code, data, stderr = selftest(target, "--arch", "llama", "--arch", "kimi_k25", vllm="0.18.1")
    assert_all_within_bound(code, data, stderr, ["llama", "kimi_k25"])

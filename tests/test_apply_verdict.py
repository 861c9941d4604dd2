"""Issue 23, item 4: ``apply`` is never calm where ``verify`` is not. After writing (or
finding nothing to write) it runs verify's checks on the result; when the install has known
breaks, no engine proof or a file modified after patching, it ends with verify's own
one-line verdict and exits 1. A patch whose own vLLM fact is missing -- the probe found no
such symbol -- is shown as ``fact-missing``, never ``not-needed``/``ok``."""

from __future__ import annotations

import pytest

from sandbox import make_sandbox
from support import WORKER, run_cli, run_json

V33_VERDICT = "verify: FAILED (the patch verdicts (fix column), the calls, no engine proof for this vLLM)"


@pytest.fixture
def v33(tmp_path):
    """speculators 0.3.0 on vLLM 0.33.0 (a CUDA wheel only; its files read, never imported)."""
    return make_sandbox(tmp_path / "env", "0.3.0", "0.33.0", vllm_dist="vllm", link=True)


def _last(result) -> list[str]:
    return result.stdout.strip().splitlines()


def test_apply_on_a_release_with_known_breaks_ends_with_verifys_verdict(v33):
    first = run_cli("apply", "--target", str(v33))
    assert first.returncode == 1, first.stderr
    assert "patched 4 file(s)" in first.stdout and V33_VERDICT in _last(first)
    verify = run_cli("verify", "--target", str(v33))
    assert verify.returncode == 1 and V33_VERDICT in _last(verify)  # the same line, word for word
    again = run_cli("apply", "--target", str(v33))
    assert again.returncode == 1 and "nothing to do" in again.stdout and V33_VERDICT in _last(again)
    assert f"speculators-patch verify --target {v33}" in again.stdout


def test_a_patch_whose_fact_is_missing_is_never_shown_calm(v33):
    code, report = run_json("verify", "--target", str(v33))
    [fact] = [f for f in report["facts"] if f["patch"] == "SP002"]
    assert fact["missing"] and not fact["holds"] and "get_kv_cache_config_from_groups not found" in fact["found"]
    [row] = [r for r in report["patches"] if r["id"] == "SP002"]
    assert (row["needed"], row["verdict"]) == (None, "fact-missing"), row
    assert "has no get_kv_cache_config_from_groups" in row["hint"]
    for command in ("status", "apply"):
        _, data = run_json(command, "--target", str(v33))
        assert {r["id"]: r["state"] for r in data["patches"]}["SP002"] == "fact-missing", command
    text = run_cli("verify", "--target", str(v33)).stdout
    assert "not-needed" not in text


def test_apply_after_a_hand_edit_is_not_calm(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    with (site / WORKER).open("a") as f:
        f.write("# edited by hand after patching\n")
    edited = (site / WORKER).read_bytes()
    result = run_cli("apply", "--target", str(sandbox))
    assert result.returncode == 1, result.stdout
    assert f"nothing written: {WORKER} changed after patching" in result.stdout
    assert "(file modified)" in result.stdout and "--adopt" in result.stdout and "--force" in result.stdout
    assert "verify: FAILED (a file modified after patching)" in _last(result)
    assert (site / WORKER).read_bytes() == edited
    verify = run_cli("verify", "--target", str(sandbox))
    assert verify.returncode == 1 and "verify: FAILED (a file modified after patching)" in _last(verify)


def test_a_healthy_apply_says_nothing_more_and_exits_0(sandbox):
    for _ in range(2):
        result = run_cli("apply", "--target", str(sandbox))
        assert result.returncode == 0 and "verify:" not in result.stdout, result.stdout
    code, report = run_json("apply", "--target", str(sandbox))
    assert code == 0 and report["verify"] == {"ok": True, "failing": []}
    assert report["exchanges"] == 2  # inspect, then the verdict's sources (a commit carries it)


def test_a_partial_apply_says_what_verify_would(sandbox):
    result = run_cli("apply", "--target", str(sandbox), "--only", "SP004")
    assert result.returncode == 1 and "verify: FAILED (the calls" in _last(result)[-2], result.stdout
    dry = run_cli("apply", "--target", str(sandbox), "--dry-run")
    assert dry.returncode == 0 and "verify:" not in dry.stdout  # a dry run writes nothing and checks nothing

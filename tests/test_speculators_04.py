"""diff, apply, verify, status and revert on real speculators 0.4.0 / 0.4.0.1 sandboxes, across
the vLLM releases speculators 0.4.x runs on (0.12-0.16, which it claims) and 0.17 (which
removed ``Request(eos_token_id=)``), from the real wheels. vLLM 0.11 lacks APIs 0.4.x
calls (``Executor.sample_tokens`` among them): patches apply and revert there too, and
``verify`` names the breaks instead of saying OK.
"""

from __future__ import annotations

import pytest
from support import GENERATOR, PREPROCESSING, PYDANTIC_UTILS, TRAINER, run_cli, run_json, tree_digest

PATCHES_04 = ["SP015", "SP016", "SP017", "SP018"]
# The training half's patches cover 0.4.x's config, preprocessing, draft and trainer as well; on
# the sandbox only SP033 (preprocessing) and SP035 (the trainer records the data's layers, a fact
# of vLLM's) are needed: SP030-SP032 are for transformers 5.4+, SP034 (the draft's wrapped
# verifier) wherever transformers has get_text_config, SP036 (the EAGLE draft's pad_token_id) for
# transformers 5.
# SP014 (transformers 5.24 lost modeling_attn_mask_utils) is not needed here (4.57.6).
# SP019 (torch in scope where pydantic rebuilds the config models) is needed on every install:
# 0.4.x's pydantic_utils.py is 0.3.0's, byte for byte (issue 46: 0.4.0.1 did not import on
# transformers 5.19 without it).
TRAINING_04 = ["SP014", "SP019", "SP030", "SP031", "SP032", "SP033", "SP034", "SP035", "SP036"]
APPLIED_04 = [*PATCHES_04, "SP019", "SP033", "SP035"]
COMBINATIONS = [("0.4.0.1", v) for v in ("0.12.0", "0.13.0", "0.14.1", "0.15.1", "0.16.0", "0.17.1")] + [
    ("0.4.0", "0.16.0"),
    ("0.4.0", "0.17.1"),
]


@pytest.mark.parametrize(("speculators", "vllm"), COMBINATIONS, ids=lambda v: v)
def test_diff_apply_verify_revert(tmp_path, speculators, vllm):
    from sandbox import make_sandbox, site_packages

    env = make_sandbox(tmp_path / "env", speculators=speculators, vllm=vllm)
    site = site_packages(env)
    before = tree_digest(site / "speculators")

    code, diff = run_json("diff", "--target", str(env))
    assert code == 1 and diff["changed"] and f"+++ b/{GENERATOR}" in diff["diff"]
    assert sorted(p["id"] for p in diff["patches"]) == sorted(PATCHES_04 + TRAINING_04)  # no 0.3.0-only patch
    assert tree_digest(site / "speculators") == before

    # apply ends with verify's verdict: OK (exit 0) only where 0.4.x ran on the engine (0.16.0)
    proven_here = vllm == "0.16.0"
    code, applied = run_json("apply", "--target", str(env))
    assert code == (0 if proven_here else 3) and sorted(applied["written"]) == sorted(
        [GENERATOR, PREPROCESSING, TRAINER, PYDANTIC_UTILS]
    )
    assert applied["verify"]["failing"] == ([] if proven_here else ["no engine proof for this vLLM"])
    assert sorted(p["id"] for p in applied["patches"] if p["state"] == "applied-now") == APPLIED_04
    compile((site / GENERATOR).read_bytes(), GENERATOR, "exec")
    code, again = run_json("apply", "--target", str(env))
    assert (
        code == (0 if proven_here else 3)
        and again["written"] == []
        and {p["state"] for p in again["patches"]} == {"applied", "not-needed"}
    )

    code, verified = run_json("verify", "--target", str(env))
    assert [
        f for f in verified["calls"]["findings"] + verified["imports"]["findings"] if f["severity"] == "error"
    ] == []
    # OK only where 0.4.x itself ran on the engine (vLLM 0.16.0); elsewhere every static check
    # passes and verify exits 3 (not proven), saying so.
    assert (code, verified["ok"], verified["proven"]["unproven"] is None) == (
        0 if proven_here else 3,
        proven_here,
        proven_here,
    )
    assert {c["id"] for c in verified["patches"]} == set(PATCHES_04 + TRAINING_04)
    assert all(c["verdict"] == "ok" for c in verified["patches"])
    vllm_facts = {f["patch"] for f in verified["facts"] if f["library"] == "vllm"}
    assert vllm_facts == {"SP015", "SP035"}  # executors answer available memory; auxiliary layers = inputs

    code, status = run_json("status", "--target", str(env))
    assert code == 0 and {p: status["files"][p] for p in (GENERATOR, PREPROCESSING)} == {
        GENERATOR: "patched",
        PREPROCESSING: "patched",
    }
    assert set(status["files"].values()) <= {"patched", "pristine"}  # config.py: no patch needed here

    code, _ = run_json("revert", "--target", str(env))
    assert code == 0 and tree_digest(site / "speculators") == before  # byte for byte


def test_0_3_0_patches_are_refused_by_name_on_0_4(tmp_path):
    from sandbox import make_sandbox, site_packages

    env = make_sandbox(tmp_path / "env", speculators="0.4.0.1", vllm="0.16.0")
    before = tree_digest(site_packages(env))
    proc = run_cli("apply", "--target", str(env), "--only", "SP011")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: SP011: written for speculators ==0.3.0, not 0.4.0.1; nothing was changed"
    assert tree_digest(site_packages(env)) == before


def test_vllm_0_11_apply_and_revert_work_and_verify_names_the_breaks(tmp_path):
    from sandbox import make_sandbox, site_packages

    env = make_sandbox(tmp_path / "env", speculators="0.4.0.1", vllm="0.11.0")
    site = site_packages(env)
    before = tree_digest(site / "speculators")
    code, applied = run_json("apply", "--target", str(env))
    assert code == 1 and sorted(p["id"] for p in applied["patches"] if p["state"] == "applied-now") == APPLIED_04
    assert "the calls" in applied["verify"]["failing"]  # apply says what verify says next
    code, verified = run_json("verify", "--target", str(env))
    breaks = [f["call"] for f in verified["calls"]["findings"] if f["severity"] == "error"]
    assert code == 1 and not verified["ok"] and "self.executor.sample_tokens(...)" in breaks
    assert all(c["verdict"] == "ok" for c in verified["patches"])
    # issue 46: every needed patch is recorded, but the install would not run: status never
    # says "patched" (exit 0) there; it says what verify's static checks found, exit 1
    status = run_cli("status", "--target", str(env))
    assert status.returncode == 1, status.stdout
    assert "install is patched" not in status.stdout
    assert (
        "install is broken (every needed patch is applied, but verify's static checks fail (the calls" in status.stdout
    )
    assert f"`speculators-patch verify --target {env}` names each break" in status.stdout
    code, data = run_json("status", "--target", str(env))
    assert (code, data["install"]["state"]) == (1, "broken")
    assert run_json("revert", "--target", str(env))[0] == 0
    assert tree_digest(site / "speculators") == before


def test_vllm_0_33_is_refused_by_apply_with_the_reason(tmp_path):
    """0.4.x's generator imports the KV cache helpers vLLM 0.33 moved (as 0.3.0's does, which
    SP023 fixes), but no 0.4.x patch covers that nor the KV cache layout 0.29+ resolves (SP020
    is 0.3.0's): apply and diff refuse in one line, nothing changes; verify still names the breaks."""
    from sandbox import make_sandbox, site_packages

    env = make_sandbox(tmp_path / "env", speculators="0.4.0.1", vllm="0.33.0", vllm_dist="vllm", link=True)
    before = tree_digest(site_packages(env) / "speculators")
    for command in ("apply", "diff"):
        proc = run_cli(command, "--target", str(env))
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.strip() == (
            "error: speculators 0.4.0.1 on vLLM 0.33.0: its generator imports _get_kv_cache_groups_uniform_spec, "
            "get_kv_cache_config_from_groups and unify_hybrid_kv_cache_specs from vllm.v1.core.kv_cache_utils, which "
            "this vLLM moved to kv_cache_planning (vllm/v1/core/kv_cache_planning.py:642); no patch for speculators "
            "0.4.0.1 covers it (SP023 is written for speculators ==0.3.0); nothing was changed"
        )
    assert tree_digest(site_packages(env) / "speculators") == before
    code, verified = run_json("verify", "--target", str(env))
    assert code == 1 and {f["subject"] for f in verified["calls"]["findings"] if f["kind"] == "missing-import"} == {
        "_get_kv_cache_groups_uniform_spec",
        "get_kv_cache_config_from_groups",
        "unify_hybrid_kv_cache_specs",
    }

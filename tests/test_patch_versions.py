"""A patch of this tool applied at another version of it (an install patched by an earlier or a
later speculators-patch): the patch's codemod finds its own earlier fix and calls it satisfied,
so only the record can tell. ``status`` says so (``partial``, the patch's row ``other-version``),
``apply`` and ``diff`` refuse in one line naming the way out and change nothing, ``verify`` fails
on it, and the way out named (``revert --only ID``, then ``apply``) leaves the bytes a fresh
``apply`` writes. The record is made to say SP008 version 1, as one written before SP008 v2 says.
Real sandboxes, the real CLI."""

from __future__ import annotations

import json

from sandbox import make_sandbox, site_packages
from support import run_cli, run_json, tree_digest

WORKER = "speculators/data_generation/custom_worker.py"


def _patched_then_recorded_at_v1(tmp_path):
    env = make_sandbox(tmp_path / "env")
    assert run_cli("apply", "--target", str(env)).returncode == 0
    fresh = (site_packages(env) / WORKER).read_bytes()
    manifest = site_packages(env) / ".speculators-patch" / "manifest.json"
    data = json.loads(manifest.read_text())
    assert data["files"][WORKER]["patches"]["SP008"] == 2  # this tool's version
    data["files"][WORKER]["patches"]["SP008"] = 1
    manifest.write_text(json.dumps(data))
    return env, fresh


def test_status_and_verify_say_which_patch_is_at_another_version(tmp_path):
    env, _ = _patched_then_recorded_at_v1(tmp_path)
    code, data = run_json("status", "--target", str(env))
    way = f"`speculators-patch revert --target {env} --only SP008`, then `speculators-patch apply --target {env}`"
    assert (code, data["install"]) == (
        1,
        {"state": "partial", "reason": f"SP008 applied at another version of the patch: {way}"},
    )
    [row] = [p for p in data["patches"] if p["id"] == "SP008"]
    assert (row["state"], row["detail"]) == ("other-version", f"applied at version 1, this tool has 2: {way}")
    verify = run_cli("verify", "--target", str(env))
    assert verify.returncode == 1
    assert "verify: FAILED (a patch applied at another version)" in verify.stdout
    assert "SP008: applied at version 1, this speculators-patch has version 2" in " ".join(verify.stdout.split())


def test_apply_and_diff_refuse_it_and_change_nothing(tmp_path):
    env, _ = _patched_then_recorded_at_v1(tmp_path)
    before = tree_digest(site_packages(env))
    for verb in ("apply", "diff"):
        result = run_cli(verb, "--target", str(env))
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.strip() == (
            f"error: SP008 was applied at version 1; this speculators-patch has version 2, and {verb} would keep "
            f"the old fix as if it were the new one: `speculators-patch revert --target {env} --only SP008` first, "
            f"then `speculators-patch apply --target {env}`"
        )
    assert tree_digest(site_packages(env)) == before


def test_the_way_out_gives_what_a_fresh_apply_writes(tmp_path):
    env, fresh = _patched_then_recorded_at_v1(tmp_path)
    assert run_cli("revert", "--target", str(env), "--only", "SP008").returncode == 0
    assert run_cli("apply", "--target", str(env)).returncode == 0
    assert (site_packages(env) / WORKER).read_bytes() == fresh
    code, data = run_json("status", "--target", str(env))
    assert (code, data["install"]["state"]) == (0, "patched")

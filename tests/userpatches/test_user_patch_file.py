"""``--patch-file``: a user's FIX001 on the real speculators 0.3.0 + vLLM 0.16 sandbox, next
to the shipped patches, through the CLI: one commit, no-op again, status with origin,
diff, partial and full revert without the file, verify noticing a changed source, and
the bad files refused in one line with nothing changed."""

from __future__ import annotations

import json

import pytest
from sandbox import make_sandbox, site_packages
from support import GENERATOR, run_cli, run_json, tree_digest
from userfix import FIX001, FIX001_LINE, installed_state, write_fix001


def fix_rows(report: dict) -> list[dict]:
    return [p for p in report["patches"] if p["id"] == "FIX001"]


def test_applies_with_the_shipped_set_in_one_commit_then_again_is_a_no_op(tmp_path, sandbox, site):
    fix = write_fix001(tmp_path / "mine")
    code, first = run_json("apply", "--target", str(sandbox), "--patch-file", str(fix))
    assert code == 0 and first["exchanges"] == 2  # one inspect, one commit
    assert GENERATOR in first["written"]
    assert fix_rows(first) == [
        {
            "id": "FIX001",
            "name": "kv-cache-half",
            "version": 1,
            "file": GENERATOR,
            "state": "applied-now",
            "detail": "",
            "origin": "file",
            "source": str(fix),
            "loaded": True,
        }
    ]
    assert "applied-now" in {p["state"] for p in first["patches"] if p["id"] == "SP004"}
    text = (site / GENERATOR).read_text()
    assert FIX001_LINE in text and "enable_prefix_caching=False" in text  # the user's and the shipped fix
    manifest = json.loads((site / ".speculators-patch" / "manifest.json").read_text())
    assert "FIX001" in manifest["files"][GENERATOR]["patches"] and "SP004" in manifest["files"][GENERATOR]["patches"]
    assert manifest["user_patches"]["FIX001"]["origin"] == "file"
    assert manifest["user_patches"]["FIX001"]["source"] == str(fix)

    after = tree_digest(site)
    code, again = run_json("apply", "--target", str(sandbox), "--patch-file", str(fix))
    assert code == 0 and again["written"] == [] and fix_rows(again)[0]["state"] == "applied"
    assert tree_digest(site) == after


def test_status_lists_it_with_its_origin_with_or_without_the_file(tmp_path, sandbox):
    fix = write_fix001(tmp_path / "mine")
    assert run_cli("apply", "--target", str(sandbox), "--patch-file", str(fix)).returncode == 0
    code, with_file = run_json("status", "--target", str(sandbox), "--patch-file", str(fix))
    assert code == 0 and fix_rows(with_file)[0]["state"] == "applied"
    assert fix_rows(with_file)[0]["origin"] == "file" and fix_rows(with_file)[0]["loaded"]
    fix.unlink()  # the file is gone: the record still names it
    code, without = run_json("status", "--target", str(sandbox))
    assert code == 0
    row = fix_rows(without)[0]
    assert (row["state"], row["origin"], row["source"], row["loaded"]) == ("applied", "file", str(fix), False)
    text = run_cli("status", "--target", str(sandbox)).stdout
    assert "FIX001 v1" in text and "origin" in text
    origin = "".join(ln.split("│")[-2] for ln in text.splitlines() if ln.count("│") == 5).replace(" ", "")
    assert f"file{fix}(recorded;sourcenotloaded)" in origin  # the column folds long paths


def test_diff_shows_it_with_the_shipped_fixes(tmp_path, sandbox, site):
    fix = write_fix001(tmp_path / "mine")
    before = tree_digest(site)
    result = run_cli("diff", "--target", str(sandbox), "--patch-file", str(fix))
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert "-CACHE_MEMORY_FRACTION = 0.2  # Fraction of GPU memory for KV cache" in lines
    assert f"+{FIX001_LINE}" in lines
    assert "+            enable_prefix_caching=False," in lines  # SP004, in the same diff
    assert tree_digest(site) == before
    only = run_cli("diff", "--target", str(sandbox), "--patch-file", str(fix), "--only", "fix001")
    assert only.returncode == 1 and [
        ln for ln in only.stdout.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")
    ] == ["-CACHE_MEMORY_FRACTION = 0.2  # Fraction of GPU memory for KV cache", f"+{FIX001_LINE}"]


def test_revert_only_it_without_the_file_equals_the_shipped_only_result(tmp_path, sandbox, site):
    pristine = tree_digest(site / "speculators")
    fix = write_fix001(tmp_path / "mine")
    assert run_cli("apply", "--target", str(sandbox), "--patch-file", str(fix)).returncode == 0
    fix.unlink()
    result = run_cli("revert", "--target", str(sandbox), "--only", "FIX001")
    assert result.returncode == 0, result.stderr
    # the generator keeps the shipped patches: FIX001 is taken out of it, no other file is touched
    words = " ".join(result.stdout.split())
    assert words.startswith(f"reverted under {site}: took FIX001 out of {GENERATOR}, which keeps its"), words
    assert words.count("speculators/") == 1, words

    shipped = make_sandbox(tmp_path / "shipped-only")
    assert run_cli("apply", "--target", str(shipped)).returncode == 0
    assert installed_state(site) == installed_state(site_packages(shipped))  # files, pristine copies, record

    assert run_cli("revert", "--target", str(sandbox)).returncode == 0
    assert tree_digest(site / "speculators") == pristine


def test_full_revert_without_the_file_restores_pristine_bytes(tmp_path, sandbox, site):
    pristine = tree_digest(site / "speculators")
    fix = write_fix001(tmp_path / "mine")
    assert run_cli("apply", "--target", str(sandbox), "--patch-file", str(fix)).returncode == 0
    fix.unlink()
    assert run_cli("revert", "--target", str(sandbox)).returncode == 0
    assert tree_digest(site / "speculators") == pristine
    assert not (site / ".speculators-patch" / "manifest.json").exists()


def test_revert_of_a_shipped_patch_needs_the_file_to_keep_the_users_fix(tmp_path, sandbox, site):
    fix = write_fix001(tmp_path / "mine")
    assert run_cli("apply", "--target", str(sandbox), "--patch-file", str(fix)).returncode == 0
    moved = tmp_path / "elsewhere.py"
    fix.rename(moved)
    before = tree_digest(site)
    result = run_cli("revert", "--target", str(sandbox), "--only", "SP004")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: FIX001 was applied from") and f"--patch-file {fix}" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and tree_digest(site) == before
    result = run_cli("revert", "--target", str(sandbox), "--only", "SP004", "--patch-file", str(moved))
    assert result.returncode == 0, result.stderr
    text = (site / GENERATOR).read_text()
    assert FIX001_LINE in text and "enable_prefix_caching=False" not in text


def test_verify_reports_a_source_changed_since_it_was_applied(tmp_path, sandbox):
    fix = write_fix001(tmp_path / "mine")
    assert run_cli("apply", "--target", str(sandbox), "--patch-file", str(fix)).returncode == 0
    code, report = run_json("verify", "--target", str(sandbox), "--patch-file", str(fix))
    assert code == 0 and report["ok"] and report["user_patch_sources_changed"] == []
    fix.write_text(FIX001.replace('"0.5"', '"0.6"'))
    code, report = run_json("verify", "--target", str(sandbox), "--patch-file", str(fix))
    assert code == 1 and not report["ok"]
    [changed] = report["user_patch_sources_changed"]
    assert (
        changed["id"] == "FIX001" and changed["source"] == str(fix) and changed["sha256"] != changed["recorded_sha256"]
    )
    text = run_cli("verify", "--target", str(sandbox), "--patch-file", str(fix)).stdout
    assert "FIX001: its source changed since it was applied" in text and "revert --only FIX001" in text
    [row] = [r for r in report["patches"] if r["id"] == "FIX001"]
    assert row["verdict"] == "source-changed" and "revert --only FIX001" in row["hint"]
    # status: still applied, from the earlier source (not "refused").
    code, status = run_json("status", "--target", str(sandbox), "--patch-file", str(fix))
    assert code == 1 and [r["state"] for r in status["patches"] if r["id"] == "FIX001"] == ["source-changed"]
    # apply, diff and a revert that keeps FIX001 refuse in one line, naming both files and
    # the ways out; nothing changes.
    before = tree_digest(site_packages(sandbox))
    for command in (["apply"], ["diff"], ["revert", "--only", "SP004"]):
        result = run_cli(*command, "--target", str(sandbox), "--patch-file", str(fix))
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith(f"error: FIX001 was applied from {fix} (sha256 ")
        assert "'revert --only FIX001' first" in result.stderr
    assert tree_digest(site_packages(sandbox)) == before
    # A new version does not make it an upgrade: the new codemod would still meet the old fix.
    fix.write_text(FIX001.replace('"0.5"', '"0.6"').replace("version=1", "version=2"))
    result = run_cli("apply", "--target", str(sandbox), "--patch-file", str(fix))
    assert result.returncode == 2 and "'revert --only FIX001' first" in result.stderr, result.stderr
    assert tree_digest(site_packages(sandbox)) == before
    # The way out it names: take the old fix out, apply the new one.
    assert run_cli("revert", "--target", str(sandbox), "--only", "FIX001", "--patch-file", str(fix)).returncode == 0
    assert run_cli("apply", "--target", str(sandbox), "--patch-file", str(fix)).returncode == 0
    assert run_json("verify", "--target", str(sandbox), "--patch-file", str(fix))[0] == 0


BROKEN = [
    pytest.param("x = (\n", "syntax error", id="syntax error"),
    pytest.param("x = 1\0\n", "syntax error: source code string cannot contain null bytes", id="NUL byte"),
    pytest.param("X = 1\n", "defines no PATCH", id="no PATCH"),
    pytest.param(FIX001.replace('id="FIX001"', 'id="SP100"'), "reserved for shipped patches", id="SP id"),
    pytest.param(FIX001.replace('id="FIX001"', 'id="fix-1"'), "is not letters then digits", id="bad id"),
    pytest.param(
        FIX001.replace('name="kv-cache-half"', 'name="disable-prefix-caching"'),
        "already taken by SP004",
        id="name clash with a shipped patch",
    ),
    pytest.param(FIX001.replace("version=1", "version=0"), "version must be an integer >= 1", id="bad version"),
    pytest.param(
        FIX001.replace("new_value = cst.parse_expression(NEW)", "new_value = 1 / 0"),
        "its codemod raised ZeroDivisionError",
        id="codemod raises",
    ),
    pytest.param("import nothing_like_this\n", "loading it raised ModuleNotFoundError", id="import fails"),
    pytest.param(
        FIX001.replace(
            'file="speculators/data_generation/vllm_hidden_states_generator.py"',
            'file="speculators/data_generation/nope.py"',
        ),
        "FIX001 patches speculators/data_generation/nope.py, which speculators 0.3.0 does not have",
        id="a file speculators does not have",
    ),
]


@pytest.mark.parametrize("source, says", BROKEN)
@pytest.mark.parametrize("command", ["apply", "diff"])
def test_a_bad_patch_file_is_one_error_line_and_nothing_changes(tmp_path, sandbox, site, source, says, command):
    fix = write_fix001(tmp_path / "mine", source=source)
    before = tree_digest(site)
    result = run_cli(command, "--target", str(sandbox), "--patch-file", str(fix))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, result.stderr
    assert says in result.stderr and ":None:" not in result.stderr
    assert tree_digest(site) == before


def test_two_files_with_one_id_and_a_missing_file_are_refused(tmp_path, sandbox, site):
    one, two = write_fix001(tmp_path / "a"), write_fix001(tmp_path / "b")
    before = tree_digest(site)
    result = run_cli("apply", "--target", str(sandbox), "--patch-file", str(one), "--patch-file", str(two))
    assert (
        result.returncode == 2
        and f"error: file {two}: patch id FIX001 is already taken by FIX001 (file {one})" in result.stderr
    )
    result = run_cli("apply", "--target", str(sandbox), "--patch-file", str(tmp_path / "nope.py"))
    assert result.returncode == 2 and "error: cannot read patch file" in result.stderr
    assert tree_digest(site) == before


def test_repair_with_the_file_rebuilds_the_record_it_had(tmp_path, sandbox, site):
    fix = write_fix001(tmp_path / "mine")
    assert run_cli("apply", "--target", str(sandbox), "--patch-file", str(fix)).returncode == 0
    manifest = site / ".speculators-patch" / "manifest.json"
    kept = json.loads(manifest.read_text())
    manifest.unlink()
    result = run_cli("repair", "--target", str(sandbox), "--patch-file", str(fix))
    assert result.returncode == 0, result.stderr
    assert f"{GENERATOR}: patched (FIX001, SP001" in result.stdout.replace("\n", " ")
    for entry in kept["files"].values():
        entry.pop("checked", None)  # apply's cache of verdicts (docs/speed.md); repair does not write it
    assert json.loads(manifest.read_text()) == kept


def test_a_patch_file_that_exits_while_loading_is_one_error_line(sandbox, tmp_path):
    """sys.exit(0) in a patch file must not pass for success (a CI job reads exit 0)."""
    bad = tmp_path / "exits.py"
    bad.write_text("import sys\nsys.exit(0)\n")
    proc = run_cli("apply", "--target", str(sandbox), "--patch-file", str(bad))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "raised SystemExit" in lines[0], proc.stderr

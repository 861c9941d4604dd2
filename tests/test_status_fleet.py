"""Issue 30 item 2 (and the RECORD half of item 3): ``status`` says what each install is.

Over several targets (``--exec``, ``--host``) each host's result is the state of its install
(patched, pristine, partial, modified, unsupported), and the run exits non-zero unless every
host is patched, as ``verify`` does. A file with no record here that is not what pip
installed (its RECORD digest differs) is never called pristine."""

from __future__ import annotations

import json
import shutil

from sandbox import make_sandbox, site_packages
from support import GENERATOR, run_cli, run_json


def _status(*pythons):
    args = [a for p in pythons for a in ("--exec", str(p / "bin" / "python"))]
    return run_cli("status", *args), json.loads(run_cli("status", *args, "--json").stdout)


def test_a_fleet_summary_names_a_pristine_host_and_fails(tmp_path):
    a, b = make_sandbox(tmp_path / "a"), make_sandbox(tmp_path / "b")
    assert run_cli("apply", "--target", str(a)).returncode == 0
    text, data = _status(a, b)
    assert text.returncode == 1 and data["exit_code"] == 1, text.stdout
    assert text.stdout.splitlines()[-1] == "2 hosts: 1 patched, 1 pristine: the hosts disagree"
    outcomes = {h["host"]: (h["outcome"], h["exit_code"]) for h in data["hosts"]}
    assert outcomes == {f"{a}/bin/python": ("patched", 0), f"{b}/bin/python": ("pristine", 1)}
    assert run_cli("apply", "--target", str(b), "--only", "SP004").returncode == 1
    text, data = _status(a, b)
    assert text.returncode == 1 and "1 patched, 1 partial" in text.stdout
    assert "needed, not applied: SP001" in {h["host"]: h["reason"] for h in data["hosts"]}[f"{b}/bin/python"]
    assert run_cli("apply", "--target", str(b)).returncode == 0
    text, _ = _status(a, b)
    assert text.returncode == 0 and text.stdout.splitlines()[-1] == "2 hosts: 2 patched"
    with (site_packages(b) / GENERATOR).open("a") as f:
        f.write("# edited by hand\n")
    text, _ = _status(a, b)
    assert text.returncode == 1 and "1 patched, 1 modified: the hosts disagree" in text.stdout


def test_an_unsupported_host_is_named_as_such(tmp_path):
    a, b = make_sandbox(tmp_path / "a"), make_sandbox(tmp_path / "b")
    metadata = site_packages(b) / "speculators-0.3.0.dist-info" / "METADATA"
    metadata.write_text(metadata.read_text().replace("Version: 0.3.0", "Version: 0.5.0"))
    text, data = _status(a, b)
    assert text.returncode == 2 and "1 pristine, 1 unsupported" in text.stdout
    [row] = [h for h in data["hosts"] if h["outcome"] == "unsupported"]
    assert row["reason"].startswith("speculators 0.5.0 is not supported")
    # each host's line on stderr is whole (a long reason is not wrapped onto more lines)
    [line] = [ln for ln in text.stderr.splitlines() if ln.strip().startswith("unsupported ")]
    assert line.strip() == f"unsupported {b}/bin/python: {row['reason']}", text.stderr


def test_status_of_one_target_names_its_install(sandbox):
    code, data = run_json("status", "--target", str(sandbox))
    assert code == 1 and data["install"]["state"] == "pristine"
    assert "install is pristine (needed, not applied: SP001" in run_cli("status", "--target", str(sandbox)).stdout


def test_a_patched_file_without_a_record_is_never_called_pristine(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    shutil.rmtree(site / ".speculators-patch")  # the record lost: the files stay patched
    code, data = run_json("status", "--target", str(sandbox))  # it cannot tell: apply's words (issue 46)
    assert code == 2 and "speculators-patch's state was lost" in data["error"], data
    assert "pristine" not in data["error"] and "install is" not in data["error"]

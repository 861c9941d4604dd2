"""The CLI and the playbook answer the same on the same states, a user's patch file included:
what changes, each patch's state, each verb's summary and notes word for word (the task's
``msg`` and ``warnings``), the refusals word for word, and "source changed" once the user
edits a patch file after applying it; ``list`` and ``repair`` too. Both sides run the same
verbs (``patcher.commands``); this holds them to it.

Two hosts of the loopback fleet start as the same fresh sandbox: the playbook works on
``node1`` over SSH, the CLI on ``node2``'s environment directly, one step after the other."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fleetplay import Fleet, recap
from sandbox import site_packages
from support import run_cli, tree_digest
from userfix import FIX001, write_fix001

from patcher.fixes.registry import shipped_patches

pytestmark = pytest.mark.ssh

PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"


class Twins:
    """One step, twice: ``play(...)`` on node1 through Ansible, ``cli(...)`` on node2's env."""

    def __init__(self, tmp_path: Path, collections: Path, fleet, env: Path, fix: Path) -> None:
        _, config = fleet
        self.fleet = Fleet(tmp_path / "play", collections, config, ["node1"])
        self.tmp, self.env, self.fix, self.runs = tmp_path, env, fix, 0

    def play(self, playbook: str, *args: str, **extra) -> tuple[bool, dict | str]:
        """(failed, the task's registered result, or its one-line message when it failed)."""
        self.runs += 1
        results = self.tmp / f"results{self.runs}"
        results.mkdir()
        extra = {"patch_files": [str(self.fix)], "results_dir": str(results), **extra}
        r = self.fleet.run(PLAYBOOKS / playbook, "-e", json.dumps(extra), *args)
        if recap(r.stdout)["node1"]["failed"]:
            m = re.search(r'fatal: \[node1\]: FAILED! => .*?"msg": "([^"]*)"', r.stdout, re.S)
            assert m, r.stdout[-3000:]
            return True, m[1]
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr
        return False, json.loads((results / "node1.json").read_text())

    def cli(self, *args: str) -> tuple[bool, dict | str]:
        """(failed, ``--json`` data, or the one-line error)."""
        done = run_cli(*args, "--target", str(self.env), "--patch-file", str(self.fix), "--json")
        data = json.loads(done.stdout)
        if done.returncode == 2:
            return True, data["error"]
        assert done.returncode in (0, 1, 3), done.stdout + done.stderr
        return False, data


def _states(rows: list[dict]) -> dict[str, str]:
    return {r["id"]: r["state"] for r in rows}


def _said(task: dict, data: dict) -> None:
    """The task says what the CLI says: ``msg`` is the verb's summary and ``warnings`` its
    notes, word for word (each side's own install path read as ROOT)."""
    assert task["msg"].replace(task["speculators"]["root"], "ROOT") == data["summary"].replace(
        data["speculators_root"], "ROOT"
    )
    assert task.get("warnings", []) == data["notes"]


def test_cli_and_playbook_answer_the_same(tmp_path, collections, fleet, fleet_envs):
    fix = write_fix001(tmp_path / "mine")
    twins = Twins(tmp_path, collections, fleet, fleet_envs[1], fix)
    node1, node2 = site_packages(fleet_envs[0]), site_packages(fleet_envs[1])
    assert tree_digest(node1) == tree_digest(node2)

    # Pristine: status, then what apply would do.
    failed, info = twins.play("info.yml", verify=False)
    _, status = twins.cli("status")
    assert not failed and _states(info["status"]["patches"]) == _states(status["patches"])
    assert info["status"]["files"] == status["files"]
    assert _states(status["patches"])["FIX001"] == "pending"
    _said(info, status)
    assert info["msg"].startswith("install is pristine (needed, not applied: ")
    failed, check = twins.play("patch.yml", "--check")
    _, dry = twins.cli("apply", "--dry-run")
    assert not failed and _states(check["patches"]) == _states(dry["patches"])
    assert check["changed"] and "pending" in _states(dry["patches"]).values()
    _said(check, dry)
    assert check["msg"].startswith("dry run: ") and check["msg"].endswith(" file(s) would change, nothing written")

    # Apply, then apply again: the same states, the same bytes.
    failed, applied = twins.play("patch.yml")
    _, done = twins.cli("apply")
    assert not failed and _states(applied["patches"]) == _states(done["patches"])
    assert applied["changed"] and sorted(applied["written"]) == sorted(done["written"])
    assert tree_digest(node1) == tree_digest(node2)
    _said(applied, done)
    assert applied["msg"].startswith(f"patched {len(done['written'])} file(s) under ")
    failed, again = twins.play("patch.yml")
    _, done = twins.cli("apply")
    assert not failed and not again["changed"] and done["written"] == []
    assert _states(again["patches"]) == _states(done["patches"])
    _said(again, done)
    assert again["msg"] == "nothing to do: every needed patch is already applied"

    # The user edits the patch file after applying it: both say "source changed" ...
    fix.write_text(FIX001.replace('NEW = "0.5"', 'NEW = "0.6"'), encoding="utf-8")
    failed, info = twins.play("info.yml", verify=False)
    _, status = twins.cli("status")
    assert not failed and _states(info["status"]["patches"]) == _states(status["patches"])
    assert _states(status["patches"])["FIX001"] == "source-changed"
    _said(info, status)

    # ... and both refuse, in the same words, to apply it, or to replay it in a partial revert.
    failed, refused = twins.play("patch.yml")
    cli_failed, cli_refused = twins.cli("apply")
    assert failed and cli_failed and refused == cli_refused
    assert "FIX001 was applied from" in refused and "'revert --only FIX001' first" in refused
    failed, refused = twins.play("patch.yml", state="reverted", only=["SP001"])
    cli_failed, cli_refused = twins.cli("revert", "--only", "SP001")
    assert failed and cli_failed and refused == cli_refused and "this revert would apply it" in refused
    assert tree_digest(node1) == tree_digest(node2)  # refusals changed nothing

    # The way out both name: revert FIX001 alone; then the edited file is pending on both.
    failed, reverted = twins.play("patch.yml", state="reverted", only=["FIX001"])
    _, done = twins.cli("revert", "--only", "FIX001")
    assert not failed and reverted["changed"] and sorted(reverted["written"]) == sorted(done["written"])
    assert tree_digest(node1) == tree_digest(node2)
    _said(reverted, done)
    # a partial revert says per file what it took out and what the file keeps (issue 46)
    assert reverted["msg"].startswith("reverted under ") and "took FIX001 out of " in reverted["msg"]
    failed, info = twins.play("info.yml", verify=False)
    _, status = twins.cli("status")
    assert not failed and _states(info["status"]["patches"]) == _states(status["patches"])
    assert _states(status["patches"])["FIX001"] == "pending"


def test_list_and_repair_answer_as_the_cli(tmp_path, collections, fleet, fleet_envs):
    """``list`` and ``repair`` through Ansible: the same rows and files, and the CLI's words."""
    fix = write_fix001(tmp_path / "mine")
    twins = Twins(tmp_path, collections, fleet, fleet_envs[1], fix)
    failed, listed = twins.play("list.yml")
    text = run_cli("list", "--patch-file", str(fix))
    rows = run_cli("list", "--patch-file", str(fix), "--json")
    assert not failed and not listed["changed"] and listed["patches"] == json.loads(rows.stdout)
    shipped = len(shipped_patches())
    said = f"{shipped + 1} patch(es): {shipped} shipped, 1 of your own"
    *_, count, supported = text.stdout.strip().splitlines()  # the CLI ends with the support statement
    assert listed["msg"] == count == said and supported.startswith("supported: speculators 0.3.0 on vLLM ")

    # Both apply, then lose their record: repair rebuilds it from the files and the kept copies.
    assert not twins.play("patch.yml")[0] and not twins.cli("apply")[0]
    for env in fleet_envs[:2]:
        (site_packages(env) / ".speculators-patch" / "manifest.json").unlink()
    failed, repaired = twins.play("repair.yml")
    _, done = twins.cli("repair")
    assert not failed and repaired["changed"] and repaired["files"] == done["files"]
    _said(repaired, done)
    # repair says what it changed: the record it wrote (issue 46)
    assert re.fullmatch(
        r"repaired: wrote manifest\.json \(\d+ file\(s\) recorded\); the record matches the files", repaired["msg"]
    )
    failed, again = twins.play("repair.yml")
    _, done = twins.cli("repair")
    assert not failed and not again["changed"] and again["msg"] == done["summary"]
    assert again["msg"] == "nothing to repair: the record already matched the files; checked again"

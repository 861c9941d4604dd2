"""Several hosts: in parallel, each on its own, a per-host summary and one exit code."""

from __future__ import annotations

import json
import threading
import time

import pytest
from loopback import USER
from sandbox import make_sandbox, site_packages
from sshfixtures import FLEET, remote
from support import run_cli, tree_digest

from patcher.cli.fanout import run_many
from patcher.errors import UserError

pytestmark = pytest.mark.ssh


def test_eight_hosts_in_parallel_from_a_hosts_file(tmp_path, fleet, fleet_envs):
    servers, config = fleet
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("# the fleet\n" + "".join(f"node{i}\n" for i in range(1, FLEET + 1)))
    before = sum(s.connections() for s in servers)
    r = remote(config, "apply", "--hosts-file", str(hosts_file), "--target", "~/ml-env", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert [h["host"] for h in result["hosts"]] == [f"node{i}" for i in range(1, FLEET + 1)]
    assert {h["outcome"] for h in result["hosts"]} == {"changed"} and result["exit_code"] == 0
    assert sum(s.connections() for s in servers) - before == FLEET  # one connection per host
    assert all(h["report"]["exchanges"] == 2 for h in result["hosts"])
    here = make_sandbox(tmp_path / "here")
    run_cli("apply", "--target", str(here))
    for env in fleet_envs:
        assert tree_digest(site_packages(env)) == tree_digest(site_packages(here))
    again = json.loads(
        remote(config, "apply", "--hosts-file", str(hosts_file), "--target", "~/ml-env", "--json").stdout
    )
    assert {h["outcome"] for h in again["hosts"]} == {"unchanged"}


def test_identical_hosts_cost_one_plan(tmp_path, fleet, fleet_envs):
    """Eight hosts with the same files, patches and vLLM facts: each file is planned (and
    its written bytes checked) once, whichever host asked first; every host gets the same
    result as a single apply here."""
    _, config = fleet
    cache = tmp_path / "cache"
    hosts = [a for i in range(1, FLEET + 1) for a in ("--host", f"node{i}")]
    r = remote(config, "apply", *hosts, "--target", "~/ml-env", "--json", env={"SPECULATORS_PATCH_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    assert {h["outcome"] for h in json.loads(r.stdout)["hosts"]} == {"changed"}
    first = json.loads(r.stdout)["hosts"][0]["report"]
    files = {p["file"] for p in first["patches"]}
    assert len(list((cache / "fast" / "plans").glob("*.json"))) == len(files)  # not one per host
    # the written bytes are checked once per file written (config.py, planned, needs nothing here)
    assert len(list((cache / "fast" / "checked").glob("*.json"))) == len(first["written"])
    here = make_sandbox(tmp_path / "here")
    run_cli("apply", "--target", str(here), env={"SPECULATORS_PATCH_NO_FAST_PATH": "1"})
    for env in fleet_envs:
        assert tree_digest(site_packages(env)) == tree_digest(site_packages(here))


def test_one_host_failing_does_not_stop_or_touch_the_others(tmp_path, fleet, fleet_envs):
    _, config = fleet
    node3 = tree_digest(fleet_envs[2])
    r = remote(config, "apply", "--host", "node1", "--host", "dead", "--host", "node2", "--target", "~/ml-env")
    assert r.returncode == 2
    # Progress on stderr, one line per host as it finishes; then the summary table.
    for line in ("changed node1", "changed node2", f"failed dead: dead ({USER}@127.0.0.1 port"):
        assert line in " ".join(r.stderr.split()), r.stderr
    table = r.stdout
    assert "per-host summary" in table and "3 hosts: 2 changed, 1 failed" in table
    assert "refused" in table
    assert [row.split("│")[2].strip() for row in table.splitlines() if row.startswith("│ node")] == [
        "changed",
        "changed",
    ]
    assert tree_digest(fleet_envs[2]) == node3  # not named: untouched


def test_json_per_host_and_exit_code_for_verify(fleet, fleet_envs):
    _, config = fleet
    assert remote(config, "apply", "--host", "node1", "--target", "~/ml-env").returncode == 0
    r = remote(
        config, "verify", "--host", "node1", "--host", "node2", "--host", "dead", "--target", "~/ml-env", "--json"
    )
    hosts = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
    assert hosts["node1"]["outcome"] == "ok" and hosts["node1"]["report"]["ok"] is True
    assert hosts["node2"]["outcome"] == "disagrees" and hosts["node2"]["exit_code"] == 1
    assert hosts["dead"]["outcome"] == "failed" and "connection refused" in hosts["dead"]["reason"]
    assert hosts["dead"]["report"] is None and r.returncode == 2
    r = remote(config, "verify", "--host", "node1", "--host", "node2", "--target", "~/ml-env", "--json")
    assert r.returncode == 1  # no failure, but a disagreement somewhere


def _probe(in_flight: list[int], peak: list[int], lock):
    def command(host: str):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.2)
        with lock:
            in_flight[0] -= 1
        if host == "bad":
            raise UserError("bad: no such host")
        if host == "bug":
            raise KeyError("boom")
        from patcher.cli import Report

        return Report({"written": ["x"], "dry_run": False}, outcome=("changed", "1 file(s) written"))

    return command


@pytest.mark.parametrize("jobs", [1, 3])
def test_concurrency_is_bounded(monkeypatch, capsys, jobs):
    """run_many itself (no SSH): never more than ``jobs`` hosts at once; failures recorded."""
    import patcher.cli.fanout as fanout

    monkeypatch.setattr(fanout, "_pool", fanout.ThreadPoolExecutor)  # to count in-flight calls
    in_flight, peak = [0], [0]
    hosts = [f"h{i}" for i in range(7)] + ["bad", "bug"]
    code = run_many(hosts, _probe(in_flight, peak, threading.Lock()), as_json=True, jobs=jobs)
    assert peak[0] == jobs and code == 2
    out = {h["host"]: h for h in json.loads(capsys.readouterr().out)["hosts"]}
    assert out["bad"]["reason"] == "bad: no such host"
    assert out["bug"]["reason"].startswith("internal error: KeyError")
    assert all(out[f"h{i}"]["outcome"] == "changed" for i in range(7))


def _verify_reports(codes: dict[str, int]):
    """run_many's command: each host's verify answers with the exit code given (3: every
    static check passes, no engine proof)."""

    def command(host: str):
        from patcher.cli import Report
        from patcher.commands.verify import NO_PROOF, InstallCheck, Verified

        code = codes[host]
        unproven = "vLLM 0.33.0 is newer than the newest release proven on the engine (0.32.x)" if code == 3 else None
        failing = {0: [], 1: ["the calls"], 3: [NO_PROOF]}[code]
        found = Verified(
            InstallCheck([], [], None, unproven, [], [], failing),
            {"ok": code == 0, "patches": [], "proven": {"unproven": unproven}},
        )
        return Report(found.data, found.exit_code, outcome=found.outcome)

    return command


@pytest.mark.parametrize(
    ("codes", "combined"),
    [
        pytest.param({"a": 0, "b": 3}, 3, id="one host not proven"),
        pytest.param({"a": 3, "b": 1}, 1, id="a disagreement outweighs not proven"),
        pytest.param({"a": 0, "b": 0}, 0, id="all ok"),
    ],
)
def test_unproven_hosts_are_told_apart_from_broken_ones(monkeypatch, capsys, codes, combined):
    import patcher.cli.fanout as fanout

    monkeypatch.setattr(fanout, "_pool", fanout.ThreadPoolExecutor)
    assert run_many(list(codes), _verify_reports(codes), as_json=True, jobs=2) == combined
    out = {h["host"]: h for h in json.loads(capsys.readouterr().out)["hosts"]}
    for host, code in codes.items():
        assert out[host]["outcome"] == {0: "ok", 1: "disagrees", 3: "unproven"}[code]
        if code == 3:
            assert out[host]["reason"].startswith("vLLM 0.33.0 is newer than the newest release proven")

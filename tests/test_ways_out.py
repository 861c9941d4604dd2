"""Issue 48: a way-out command is a value (``patcher.ways.Way``) that the layers below write as a
token, the agent too, and the front end says once with the run's target options. A command
copied from the output acts on the target the run checked, whoever wrote the line: the agent's
lines said ``speculators-patch repair`` / ``status`` without the run's ``--target``, so run as
printed they acted on the active environment. Real sandboxes, the real CLI."""

from __future__ import annotations

import ast
import json
import re
import shlex

import pytest
from sandbox import pip_install, pip_uninstall
from support import ROOT, commit_point_steps, run_cli, run_json

from patcher import ways
from patcher.agent import common as agent
from patcher.cli.options import Advice, Options
from patcher.connect.exec import ExecTarget
from patcher.ways import Way

STATE = ".speculators-patch"


def _one_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --- The value and its words (fast) -------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    "way, opts, host, said",
    [
        pytest.param(Way("repair"), Options(), None, "speculators-patch repair", id="local, no option"),
        pytest.param(
            Way("apply", ("--adopt",)),
            Options(target="/e nv"),
            None,
            "speculators-patch apply --target '/e nv' --adopt",
            id="target quoted, flags last",
        ),
        pytest.param(
            Way("revert"),
            Options(ssh_config="cfg", patch_files=("p.py",)),
            "gpu1",
            "speculators-patch revert --host gpu1 --ssh-config cfg --patch-file p.py",
            id="host and patch file",
        ),
        pytest.param(
            Way("status"),
            Options(target="/env"),
            ExecTarget("docker exec -i c python3"),
            "speculators-patch status --exec 'docker exec -i c python3' --target /env",
            id="exec",
        ),
        pytest.param(
            Way("selftest"), Options(patch_files=("p.py",)), None, "speculators-patch selftest", id="no --patch-file"
        ),
    ],
)
def test_a_way_is_said_with_the_runs_target_options(way, opts, host, said):
    advice = Advice(opts, host)
    assert advice.say(way) == said
    assert advice.render(f"then `{way}`.") == f"then `{said}`."
    assert ways.render(f"`{way}`") == f"`{way.plain()}`"  # no option: the plain command


@pytest.mark.fast
def test_the_agents_token_is_the_controllers():
    """The agent (standard library only) writes the token the controller reads: the verb and
    nothing of where; the run's options are the controller's to add."""
    assert agent.way("repair") == str(Way("repair"))
    assert (
        Advice(Options(target="/env"))
        .render(agent.REPAIR_HINT)
        .startswith("`speculators-patch repair --target /env` rebuilds the record")
    )


@pytest.mark.fast
def test_a_way_renders_inside_json_data():
    data = {"hint": f"`{Way('apply')}`", "rows": [{"why": str(Way("repair"))}], "n": 1}
    said = ways.render_all(data, Advice(Options(target="/t")).say)
    assert said == {
        "hint": "`speculators-patch apply --target /t`",
        "rows": [{"why": "speculators-patch repair --target /t"}],
        "n": 1,
    }


# A way out written as text below the front end is said without the run's options. What is
# not a way out for this target: a past step (check-draft), another box (a GPU proof), the
# template of a new patch file.
NOT_A_WAY = ("Trained before `speculators-patch apply`?", "on a GPU box", "`speculators-patch diff --patch-file ")


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of ``tree``'s module, classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


@pytest.mark.fast
def test_no_layer_below_the_front_end_writes_a_way_out_as_text():
    command = re.compile(r"(^|[`'])speculators-patch (apply|diff|revert|repair|status|verify|selftest)\b")
    written = []
    for path in sorted((ROOT / "patcher").rglob("*.py")):
        if path.relative_to(ROOT / "patcher").parts[0] == "cli":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                if command.search(node.value) and not any(n in node.value for n in NOT_A_WAY):
                    written.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.strip()[:80]}")
    assert written == []


# --- The agent's lines, said for the target (real sandboxes) ------------------------------


def test_the_state_left_by_a_pip_uninstall_names_repair_with_the_target(sandbox, site):
    """The agent's "speculators was uninstalled since ... `repair` removes it", for each way
    to reach the target: ``--target``, and ``--exec`` (a fan-out row too)."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    pip_uninstall(sandbox, "speculators")
    line = _one_error(run_cli("status", "--target", str(sandbox)))
    assert f"`speculators-patch repair --target {sandbox}` removes it" in line, line

    python = str(sandbox / "bin" / "python")
    line = _one_error(run_cli("status", "--exec", python))
    assert f"`speculators-patch repair --exec {python}` removes it" in line, line
    code, data = run_json("status", "--exec", python, "--exec", f"{python} -I")
    assert code == 2 and [h["outcome"] for h in data["hosts"]] == ["failed", "failed"]
    for host in data["hosts"]:  # each row with its own host's way
        assert f"`speculators-patch repair --exec {shlex.quote(host['host'])}` removes it" in host["reason"], host


def test_a_lost_pristine_copy_names_repair_with_the_target(sandbox, site):
    """The agent's "reinstall speculators ..., then run `repair`" when a kept copy is gone."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    for kept in (site / STATE / "pristine").rglob("*"):
        if kept.is_file():
            kept.unlink()
    line = _one_error(run_cli("status", "--target", str(sandbox)))
    assert "the pristine copy of" in line and f"then run `speculators-patch repair --target {sandbox}`" in line, line


def test_a_damaged_record_names_repair_with_the_target(sandbox, site):
    """The rule both sides run (``manifest_rules.REPAIR_HINT``), as the agent refuses in it."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    path = site / STATE / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"] = 3
    path.write_text(json.dumps(manifest))
    line = _one_error(run_cli("status", "--target", str(sandbox)))
    assert "is damaged" in line and f"`speculators-patch repair --target {sandbox}` rebuilds the record" in line, line


def test_pips_doing_names_repair_with_the_target_in_the_reason_and_the_note(sandbox, site):
    """status's reason and every verb's note on what pip did (they said `speculators-patch
    repair` alone while the refusals said `repair --target`)."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    pip_install(sandbox, "speculators", "0.4.0.1")
    said = f"`speculators-patch repair --target {sandbox}` drops"
    code, report = run_json("status", "--target", str(sandbox))
    assert code == 1 and said in report["install"]["reason"], report["install"]
    assert any(said in note for note in report["notes"]), report["notes"]
    verified = run_cli("verify", "--target", str(sandbox))
    assert said in verified.stderr, verified.stderr


def test_an_unfinished_clean_up_names_status_with_the_target(sandbox, tmp_path):
    """apply: NOT FINISHED, the agent's "then run `status`: it finishes the cleanup"."""
    _, step = commit_point_steps(tmp_path)

    done = run_cli("apply", "--target", str(sandbox), env={"SPECULATORS_PATCH_FAULT": f"eacces@{step}"})
    assert done.returncode == 1 and "apply: NOT FINISHED" in done.stdout, done.stdout + done.stderr
    flat = " ".join(done.stdout.split())
    assert f"then run `speculators-patch status --target {sandbox}`: it finishes the cleanup" in flat, flat

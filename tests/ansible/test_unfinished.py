"""Issue 46: the ``speculators_patch`` task fails when its commit was made but the clean-up
after it could not finish (the CLI exits 1 there), and says so with the way out. A real
sandbox, the installed collection, ``ansible-playbook`` on localhost; the agent's fault
injection stops the first deletion after the commit point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fleetplay import BIN
from sandbox import make_sandbox, site_packages
from support import run_cli

PLAY = """\
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - speculators.patch.speculators_patch:
        target: {target}
        state: {state}
      register: result
      ignore_errors: true
    - ansible.builtin.copy:
        content: "{{{{ result | to_nice_json }}}}"
        dest: {out}
        mode: "0644"
"""


def _play(tmp_path: Path, collections: Path, env_dir: Path, state: str, fault: dict) -> dict:
    out = tmp_path / f"{state}.json"
    book = tmp_path / f"{state}.yml"
    book.write_text(PLAY.format(target=env_dir, state=state, out=out))
    env = {
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        "PATH": f"{BIN}:/usr/bin:/bin",
        **fault,
    }
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", str(book)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def _first_deletion_after_commit(log: Path) -> int:
    """The step number (in the committing agent's own count) of the first deletion after the
    commit point (``rename ... cleanup.json``), from a fault log of a run."""
    lines = [ln.split(" ", 2) for ln in log.read_text().splitlines()]
    at = next(i for i, (_, what, path) in enumerate(lines) if what == "rename" and path.endswith("cleanup.json"))
    return next(int(n) for n, what, _ in lines[at + 1 :] if what == "unlink")


@pytest.mark.parametrize("state", ["patched", "reverted"])
def test_a_task_whose_clean_up_stopped_fails(tmp_path, collections, state):
    probe, env_dir = make_sandbox(tmp_path / "probe"), make_sandbox(tmp_path / "env")
    if state == "reverted":
        for env in (probe, env_dir):
            assert run_cli("apply", "--target", str(env)).returncode == 0
    log = tmp_path / "steps.log"
    _play(
        tmp_path,
        collections,
        probe,
        state,
        {"SPECULATORS_PATCH_FAULT": "none@0", "SPECULATORS_PATCH_FAULT_LOG": str(log)},
    )
    step = _first_deletion_after_commit(log)

    result = _play(tmp_path, collections, env_dir, state, {"SPECULATORS_PATCH_FAULT": f"eacces@{step}"})
    assert result["failed"] is True and result["changed"] is True, result
    assert "NOT FINISHED" in result["msg"] and result["unfinished"], result["msg"]
    verb = "apply" if state == "patched" else "revert"
    assert verb in result["msg"]
    # the agent's way out, said as the CLI says it for this task's target (it named no target)
    assert f"then run `speculators-patch status --target {env_dir}`: it finishes the cleanup" in result["msg"]
    # the next command finishes the clean-up: the install is what the task committed
    code = run_cli("status", "--target", str(env_dir)).returncode
    assert code == (0 if state == "patched" else 1)
    assert not any(p.name.endswith(".speculators-patch.old") for p in site_packages(env_dir).rglob("*"))

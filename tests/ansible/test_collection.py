"""The collection as a package: documentation, ansible-lint, and the module's refusals."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fleetplay import BIN, COLLECTION_SRC, ROOT

MODULES = (
    "speculators.patch.speculators_patch",
    "speculators.patch.speculators_patch_info",
    "speculators.patch.speculators_patch_list",
    "speculators.patch.speculators_patch_repair",
)


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_reads_the_documentation(collections, module):
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections)}
    r = subprocess.run([str(BIN / "ansible-doc"), "--json", module], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    import json

    doc = json.loads(r.stdout)[module]
    assert doc["doc"]["options"]["patch_files"]["type"] == "list"
    assert doc["examples"].strip() and doc["return"]["msg"]


def test_ansible_lint_passes_on_the_collection_and_the_example(collections):
    lint = BIN / "ansible-lint"
    if not lint.exists():
        pytest.skip("ansible-lint not installed (pip install -e '.[test]')")
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections), "NO_COLOR": "1"}
    r = subprocess.run(
        [str(lint), "--offline", "ansible/", "tests/ansible/playbooks"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr


class _Failed(Exception):
    pass


class _Module:
    """Just enough of AnsibleModule for agent_relay.relay."""

    def __init__(self, op: str, check_mode: bool) -> None:
        self.check_mode = check_mode
        self.params = {
            "target": None,
            "_agent": "agent",
            "_bootstrap": "bootstrap",
            "_where": "h",
            "_request": {"op": op},
        }
        self.ran = False

    def fail_json(self, msg):
        raise _Failed(msg)

    def run_command(self, *a, **kw):
        self.ran = True
        return 1, b"", b"boom"


def _relay():
    sys.path.insert(0, str(COLLECTION_SRC.parents[1]))
    import importlib.util

    spec = importlib.util.spec_from_file_location("agent_relay", COLLECTION_SRC / "plugins/module_utils/agent_relay.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.relay


@pytest.mark.parametrize(
    "check_mode, writes_allowed", [(True, True), (False, False)], ids=["check-mode", "info-module"]
)
def test_the_module_refuses_a_commit_in_check_mode_and_in_the_info_module(check_mode, writes_allowed):
    module = _Module("commit", check_mode)
    with pytest.raises(_Failed, match="refusing agent request 'commit'"):
        _relay()(module, writes_allowed)
    assert not module.ran


def test_a_read_request_runs_the_bootstrap_and_an_agent_without_answer_fails_in_one_line():
    module = _Module("inspect", check_mode=True)
    with pytest.raises(_Failed, match=r"^h: the agent ended \(status 1\) without answering inspect: boom$"):
        _relay()(module, True)
    assert module.ran

"""A user's FIX001 over real loopback sshd servers, the file only on the controller: each
server runs its sessions in a mount namespace where a tmpfs hides the controller's
directory, so the remote side could not read the file if it tried."""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess

import pytest
from loopback import LoopbackSshd, write_ssh_config
from sandbox import make_sandbox, site_packages
from support import GENERATOR, run_cli, tree_digest
from userfix import FIX001_LINE, installed_state, write_fix001

pytestmark = pytest.mark.ssh


@pytest.fixture
def two_hosts(tmp_path, keys):
    """(controller directory holding fix001.py, ssh config with box1 and box2, their ~/ml-env)."""
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --mount needs root or user namespaces")
    controller = tmp_path / "controller"
    fix = write_fix001(controller)
    hide = f'mount -t tmpfs tmpfs {shlex.quote(str(controller))} && exec sh -c "$SSH_ORIGINAL_COMMAND"'
    force = f"ForceCommand unshare --mount sh -c {shlex.quote(hide)}\n"
    with contextlib.ExitStack() as stack:
        servers, envs = [], []
        for name in ("box1", "box2"):
            home = tmp_path / name / "home"
            home.mkdir(parents=True)
            envs.append(make_sandbox(home / "ml-env"))
            servers.append(
                stack.enter_context(LoopbackSshd(tmp_path / name, home=home, user_key=keys["user"], extra_config=force))
            )
        config = write_ssh_config(
            tmp_path / "ssh_config", [s.host_block(n) for s, n in zip(servers, ("box1", "box2"), strict=False)]
        )
        yield fix, config, envs


def ssh(config, *args):
    return run_cli(*args, "--ssh-config", str(config))


def test_the_file_only_on_the_controller_applies_diffs_shows_and_reverts(tmp_path, two_hosts):
    fix, config, envs = two_hosts
    pristine = tree_digest(site_packages(envs[0]) / "speculators")
    seen = subprocess.run(
        ["ssh", "-F", str(config), "box1", f"test -e {shlex.quote(str(fix))} && echo seen || echo hidden"],
        capture_output=True,
        text=True,
    )
    assert seen.stdout.strip() == "hidden", seen.stderr

    diff = ssh(config, "diff", "--host", "box1", "--target", "~/ml-env", "--patch-file", str(fix))
    assert diff.returncode == 1 and f"+{FIX001_LINE}" in diff.stdout.splitlines(), diff.stderr

    hosts = ("--host", "box1", "--host", "box2", "--target", "~/ml-env", "--patch-file", str(fix))
    result = ssh(config, "apply", *hosts, "--json")
    assert result.returncode == 0, result.stderr
    for host in json.loads(result.stdout)["hosts"]:
        assert host["outcome"] == "changed" and GENERATOR in host["report"]["written"]
        assert [p["state"] for p in host["report"]["patches"] if p["id"] == "FIX001"] == ["applied-now"]
    local = make_sandbox(tmp_path / "local")
    assert run_cli("apply", "--target", str(local), "--patch-file", str(fix)).returncode == 0
    for env in envs:
        # the same bytes as local; the manifest records the controller's path for both
        assert tree_digest(site_packages(env)) == tree_digest(site_packages(local))

    again = ssh(config, "apply", *hosts)
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == "2 hosts: 2 unchanged"

    status = json.loads(ssh(config, "status", "--host", "box1", "--target", "~/ml-env", "--json").stdout)
    row = next(p for p in status["patches"] if p["id"] == "FIX001")
    assert (row["state"], row["origin"], row["source"]) == ("applied", "file", str(fix))

    result = ssh(config, "revert", "--host", "box1", "--host", "box2", "--target", "~/ml-env", "--only", "FIX001")
    assert result.returncode == 0, result.stderr
    shipped = make_sandbox(tmp_path / "shipped-only")
    assert run_cli("apply", "--target", str(shipped)).returncode == 0
    for env in envs:
        assert installed_state(site_packages(env)) == installed_state(site_packages(shipped))

    assert ssh(config, "revert", "--host", "box1", "--host", "box2", "--target", "~/ml-env").returncode == 0
    for env in envs:
        assert tree_digest(site_packages(env) / "speculators") == pristine

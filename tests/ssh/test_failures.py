"""Each way a remote run can fail: one clear line, exit code 2, and the remote install
either untouched or fully patched -- never half."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest
from loopback import USER
from sandbox import make_sandbox, site_packages
from sshfixtures import remote, start_apply_paused_mid_write, wait_for
from support import PATCHED_FILES, run_cli, tree_digest

pytestmark = pytest.mark.ssh


def assert_one_line_error(result, *fragments: str) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "alias, fragments",
    [
        ("refused", [f"refused ({USER}@127.0.0.1 port", "connection refused", "is sshd running"]),
        ("stranger", ["authentication failed (publickey)", "ssh-agent"]),
        ("unknown-key", ["unknown host key", "host key checking stays on"]),
        ("changed-key", ["host key CHANGED", "refusing to connect"]),
        ("blackhole", ["blackhole", "timed out"]),
    ],
)
def test_connection_failures_are_one_clear_line(sandbox, ssh_config, alias, fragments):
    before = tree_digest(sandbox)
    start = time.monotonic()
    assert_one_line_error(remote(ssh_config, "apply", "--host", alias, "--target", str(sandbox)), *fragments)
    assert time.monotonic() - start < 20
    assert tree_digest(sandbox) == before


def test_a_host_that_does_not_answer_within_connect_timeout_is_a_timeout(sandbox, ssh_config):
    """--connect-timeout below ssh's own 15 s: ssh still gives up first and says why (the
    far side was called "silent: not a Python that runs the program given to it?")."""
    start = time.monotonic()
    line = assert_one_line_error(
        remote(ssh_config, "status", "--host", "no-answer", "--target", str(sandbox), "--connect-timeout", "4"),
        "no-answer",
        "connection timed out",
    )
    assert "silent" not in line and time.monotonic() - start < 10


def test_unknown_host_key_is_not_added_silently(sandbox, sshd, ssh_config):
    remote(ssh_config, "status", "--host", "unknown-key", "--target", str(sandbox))
    assert (sshd.dir / "empty_known_hosts").read_text() == ""


@contextlib.contextmanager
def read_only(path):
    """Bind-mount ``path`` read-only over itself (needs CAP_SYS_ADMIN)."""
    bind = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root/CAP_SYS_ADMIN): {bind.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("command", ["apply", "revert"])
def test_read_only_remote_filesystem(sandbox, sshd, ssh_config, command):
    site = site_packages(sandbox)
    if command == "revert":  # patched earlier: the state directory and its lock file exist
        assert remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(sandbox)).returncode == 0
    before = tree_digest(site)
    with read_only(site):
        line = assert_one_line_error(
            remote(ssh_config, command, "--host", "gpu-box", "--target", str(sandbox)),
            "cannot write to",
            "Read-only file system",
        )
        assert "agent ended" not in line  # refused cleanly, not crashed
    assert tree_digest(site) == before


def test_connection_dropped_mid_write_still_completes(tmp_path, sshd, ssh_config):
    here, there = make_sandbox(tmp_path / "here"), make_sandbox(tmp_path / "there")
    assert run_cli("apply", "--target", str(here)).returncode == 0
    journal = site_packages(there) / ".speculators-patch" / "journal.json"
    proc = start_apply_paused_mid_write(ssh_config, there)
    assert journal.exists()  # in the middle of the write phase
    assert sshd.kill_sessions()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "connection dropped while committing" in err, err
    wait_for(lambda: not journal.exists(), 30, "the agent to finish on its own")
    assert tree_digest(site_packages(there)) == tree_digest(site_packages(here))
    again = json.loads(remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(there), "--json").stdout)
    assert again["written"] == [] and again["notes"] == []


def test_agent_killed_mid_write_next_apply_completes(tmp_path, sshd, ssh_config):
    here, there = make_sandbox(tmp_path / "here"), make_sandbox(tmp_path / "there")
    assert run_cli("apply", "--target", str(here)).returncode == 0
    proc = start_apply_paused_mid_write(ssh_config, there)
    agents = sshd.agents()
    assert agents
    for pid in agents:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "the remote agent was killed while committing" in err, err
    # Half written, with the journal to undo it; the next contact notices it ...
    status = json.loads(remote(ssh_config, "status", "--host", "gpu-box", "--target", str(there), "--json").stdout)
    assert any("interrupted" in n for n in status["notes"])
    # ... and the next apply rolls back the half commit and completes the patch set.
    again = json.loads(remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(there), "--json").stdout)
    assert sorted(again["written"]) == PATCHED_FILES, again
    assert tree_digest(site_packages(there)) == tree_digest(site_packages(here))


def test_missing_ssh_config_file_and_missing_ssh_client(sandbox, tmp_path):
    assert_one_line_error(
        run_cli("status", "--host", "gpu-box", "--target", str(sandbox), "--ssh-config", str(tmp_path / "nope")),
        "Can't open user config file",
    )
    assert_one_line_error(
        run_cli("status", "--host", "gpu-box", "--target", str(sandbox), env={"PATH": str(tmp_path)}),
        "no `ssh` client on this machine",
    )


@pytest.fixture(scope="module")
def odd_servers(tmp_path_factory, keys):
    """sshd servers whose every session runs a fixed command instead of ours (sshd
    ``ForceCommand``): ``cat`` sends our input back, ``sleep`` never answers."""
    from loopback import LoopbackSshd, write_ssh_config

    root = tmp_path_factory.mktemp("odd")
    with (
        LoopbackSshd(root / "echo", user_key=keys["user"], extra_config="ForceCommand cat\n") as echo,
        LoopbackSshd(root / "silent", user_key=keys["user"], extra_config="ForceCommand sleep 600\n") as silent,
    ):
        yield write_ssh_config(root / "ssh_config", [echo.host_block("echo-box"), silent.host_block("silent-box")])


def test_a_host_that_echoes_or_stays_silent_is_one_line_within_the_bound(odd_servers):
    import time

    start = time.monotonic()
    r = remote(odd_servers, "status", "--host", "echo-box")
    assert r.returncode == 2 and "echo-box (" in r.stderr and "it sent our own input back" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and time.monotonic() - start < 10
    start = time.monotonic()
    r = remote(odd_servers, "status", "--host", "silent-box", "--connect-timeout", "3")
    took = time.monotonic() - start
    assert (
        r.returncode == 2
        and "no answer within 3 s (--connect-timeout) while starting the agent: it printed nothing" in r.stderr
    ), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and 3 <= took < 12

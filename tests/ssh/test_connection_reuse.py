"""``--ssh-persist``: a run leaves its SSH connection open for the next run to the same host
(OpenSSH ControlMaster/ControlPersist), and nothing else about a run changes.

The rest of the SSH tests count one connection per run, so the suite turns reuse off
(``tests/conftest.py``); these tests turn it on, each with a controller cache of its own
under a short path (a unix socket path must stay under 104 bytes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
from loopback import close_masters
from sandbox import make_sandbox, site_packages
from sshfixtures import remote, start_apply_paused_mid_write, wait_for
from support import PATCHED_FILES, run_cli, tree_digest

pytestmark = pytest.mark.ssh


@pytest.fixture
def cache():
    """A controller cache whose ``ssh/`` socket directory has a short path; masters closed after."""
    folder = Path(tempfile.mkdtemp(prefix="sp-"))
    yield folder
    close_masters(folder / "ssh")
    shutil.rmtree(folder, ignore_errors=True)


def reuse(cache: Path, seconds: int = 60) -> dict:
    return {"SPECULATORS_PATCH_CACHE": str(cache), "SPECULATORS_PATCH_SSH_PERSIST": str(seconds)}


def sockets(cache: Path) -> list[Path]:
    folder = cache / "ssh"
    return sorted(p for p in folder.iterdir() if p.is_socket()) if folder.is_dir() else []


def master_pid(socket: Path) -> int:
    check = subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "check", "x"], capture_output=True, text=True)
    found = re.search(r"pid=(\d+)", check.stderr)
    assert check.returncode == 0 and found, check.stderr
    return int(found[1])


def run(ssh_config, command, sandbox, env, *extra):
    """One CLI run on ``gpu-box`` with --json: its answer without the exchange count."""
    r = remote(ssh_config, command, "--host", "gpu-box", "--target", str(sandbox), "--json", *extra, env=env)
    assert r.returncode in (0, 1), r.stderr
    data = json.loads(r.stdout)
    data.pop("exchanges", None)
    return data


def test_the_next_run_reuses_the_connection_with_the_same_answer(sandbox, ssh_config, sshd, cache):
    assert remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(sandbox), env=reuse(cache)).returncode == 0
    assert len(sockets(cache)) == 1 and oct(os.stat(cache / "ssh").st_mode & 0o777) == "0o700"
    before = sshd.connections()
    shared = run(ssh_config, "verify", sandbox, reuse(cache))
    assert sshd.connections() == before  # no new connection: the master from apply served it
    fresh = run(ssh_config, "verify", sandbox, reuse(cache), "--ssh-persist", "0")
    assert sshd.connections() == before + 1
    assert shared == fresh and shared["ok"]


def test_persist_zero_opens_a_connection_per_run_and_leaves_no_socket(sandbox, ssh_config, sshd, cache):
    before = sshd.connections()
    for _ in range(2):
        r = remote(
            ssh_config,
            "status",
            "--host",
            "gpu-box",
            "--target",
            str(sandbox),
            "--ssh-persist",
            "0",
            env={"SPECULATORS_PATCH_CACHE": str(cache)},
        )
        assert r.returncode == 1, r.stderr  # status of a pristine install: read, not patched
    assert sshd.connections() == before + 2 and sockets(cache) == []


def test_a_killed_master_costs_one_new_connection(sandbox, ssh_config, sshd, cache):
    first = run(ssh_config, "status", sandbox, reuse(cache))
    [socket] = sockets(cache)
    os.kill(master_pid(socket), signal.SIGKILL)  # the stale socket stays behind
    before = sshd.connections()
    assert run(ssh_config, "status", sandbox, reuse(cache)) == first
    assert sshd.connections() == before + 1 and master_pid(socket) > 0


def test_aliases_with_different_settings_never_share_a_connection(tmp_path, ssh_config, sshd, cache):
    """``slow-writer`` is the same server as ``gpu-box`` with ``SetEnv`` (the agent pauses
    mid-commit): through gpu-box's master that setting would be lost."""
    there = make_sandbox(tmp_path / "there")
    run(ssh_config, "status", there, reuse(cache))

    proc = start_apply_paused_mid_write(ssh_config, there, extra_env=reuse(cache))
    journal = site_packages(there) / ".speculators-patch" / "journal.json"
    assert journal.exists()  # paused mid-write: the SetEnv reached the agent
    assert len(sockets(cache)) == 2
    proc.kill()
    proc.wait()


def test_a_dropped_shared_connection_mid_commit_still_completes(tmp_path, ssh_config, sshd, cache):
    """The mid-commit connection drop of test_failures, through a shared connection."""

    here, there = make_sandbox(tmp_path / "here"), make_sandbox(tmp_path / "there")
    assert run_cli("apply", "--target", str(here)).returncode == 0
    journal = site_packages(there) / ".speculators-patch" / "journal.json"
    proc = start_apply_paused_mid_write(ssh_config, there, extra_env=reuse(cache))
    assert journal.exists() and len(sockets(cache)) == 1
    assert sshd.kill_sessions()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "connection dropped while committing" in err, err
    wait_for(lambda: not journal.exists(), 30, "the agent to finish on its own")
    assert tree_digest(site_packages(there)) == tree_digest(site_packages(here))
    again = remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(there), "--json", env=reuse(cache))
    assert json.loads(again.stdout)["written"] == []


def test_an_agent_killed_mid_commit_is_told_apart_from_a_dropped_connection(tmp_path, ssh_config, sshd, cache):
    """Through a shared connection ssh says nothing either way; the master still being
    there is what tells a killed agent from a dropped link."""

    there = make_sandbox(tmp_path / "there")
    proc = start_apply_paused_mid_write(ssh_config, there, extra_env=reuse(cache))
    for pid in sshd.agents():
        os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "the remote agent was killed while committing" in err, err
    again = run(ssh_config, "apply", there, reuse(cache))  # rolls the half commit back, then applies
    assert sorted(again["written"]) == PATCHED_FILES


def test_the_users_own_control_path_is_kept(tmp_path, sandbox, sshd, cache):
    own = Path(tempfile.mkdtemp(prefix="cm-"))
    try:
        config = tmp_path / "ssh_config"
        config.write_text(
            sshd.host_block("mine", extra=f"  ControlMaster auto\n  ControlPath {own}/%C\n  ControlPersist 30\n")
        )
        r = remote(config, "status", "--host", "mine", "--target", str(sandbox), env=reuse(cache))
        assert r.returncode == 1, r.stderr  # read, not patched
        assert sockets(cache) == [] and [p for p in own.iterdir() if p.is_socket()]
    finally:
        close_masters(own)
        shutil.rmtree(own, ignore_errors=True)


@pytest.mark.parametrize("setting", ["ControlMaster no", "ControlPath none"])
def test_a_users_explicit_no_is_kept(tmp_path, sandbox, sshd, cache, setting):
    """``ssh -G`` prints the same for ``ControlPath none`` as for nothing set; the user's
    "no" still wins (docs/ssh.md)."""
    config = tmp_path / "ssh_config"
    config.write_text(sshd.host_block("mine", extra=f"  {setting}\n"))
    before = sshd.connections()
    for _ in range(2):
        r = remote(config, "status", "--host", "mine", "--target", str(sandbox), env=reuse(cache))
        assert r.returncode == 1, r.stderr  # read, not patched
    assert sshd.connections() == before + 2 and sockets(cache) == []


def test_a_socket_directory_others_can_enter_is_not_used(sandbox, ssh_config, sshd, cache):
    (cache / "ssh").mkdir(mode=0o755)
    os.chmod(cache / "ssh", 0o755)
    before = sshd.connections()
    answers = [run(ssh_config, "status", sandbox, reuse(cache)) for _ in range(2)]
    assert answers[0] == answers[1]
    assert sshd.connections() == before + 2 and sockets(cache) == []


def test_a_patched_install_is_the_same_either_way(tmp_path, ssh_config, cache):
    a, b = make_sandbox(tmp_path / "a"), make_sandbox(tmp_path / "b")
    for env, extra in ((a, ()), (b, ("--ssh-persist", "0"))):
        assert sorted(run(ssh_config, "apply", env, reuse(cache), *extra)["written"]) == PATCHED_FILES
    assert len(sockets(cache)) == 1
    assert tree_digest(site_packages(a)) == tree_digest(site_packages(b))


# --- A kept connection never outlives a change in what it was trusted with (issue 23) ---


def _own_trust(tmp_path: Path, sshd, where: str = "user", extra: str = "") -> tuple[Path, Path, Path]:
    """A config for ``trusting-box`` whose known_hosts file (``where``: the user's or the
    global one) and identity file are copies of its own, so a test can swap them."""
    known = tmp_path / f"{where}_known_hosts"
    known.write_text(sshd.known_hosts.read_text())
    key = tmp_path / "id_ed25519"
    shutil.copy(sshd.user_key, key)
    shutil.copy(f"{sshd.user_key}.pub", f"{key}.pub")
    os.chmod(key, 0o600)
    block = sshd.host_block("trusting-box", key=key, known_hosts=known if where == "user" else Path("/dev/null"))
    if where == "global":
        block = block.replace("GlobalKnownHostsFile /dev/null", f"GlobalKnownHostsFile {known}")
    config = tmp_path / "ssh_config"
    config.write_text(block + extra)
    return config, known, key


def _status(config: Path, sandbox: Path, cache: Path):
    return remote(config, "status", "--host", "trusting-box", "--target", str(sandbox), env=reuse(cache))


def _gone(pid: int, seconds: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("where", ["user", "global"])
def test_a_host_key_swapped_under_a_live_master_is_checked_again(tmp_path, sandbox, sshd, keys, cache, where):
    """The user replaces the host's known_hosts entry with another key while the first
    run's master is alive: the next run is refused as with a connection of its own (it was
    ridden for a minute), and the master trusted under the old entry is stopped."""
    config, known, _ = _own_trust(tmp_path, sshd, where)
    assert _status(config, sandbox, cache).returncode == 1  # read, not patched
    [first] = sockets(cache)
    pid = master_pid(first)
    right = known.read_text()
    wrong = " ".join(Path(f"{keys['stranger']}.pub").read_text().split()[:2])
    known.write_text(f"[127.0.0.1]:{sshd.port} {wrong}\n")
    before = sshd.connections()
    r = _status(config, sandbox, cache)
    assert r.returncode == 2 and "the host key CHANGED" in r.stderr, r.stderr
    assert sshd.connections() == before  # nothing authenticated: the new key was checked, not ridden
    assert _gone(pid) and not first.exists()
    known.write_text(right)  # the right key again: a new connection, the same answer
    assert _status(config, sandbox, cache).returncode == 1  # read, not patched
    assert sshd.connections() == before + 1


def test_an_identity_swapped_under_a_live_master_authenticates_again(tmp_path, sandbox, sshd, keys, cache):
    config, _, key = _own_trust(tmp_path, sshd)
    assert _status(config, sandbox, cache).returncode == 1  # read, not patched
    [first] = sockets(cache)
    pid = master_pid(first)
    shutil.copy(keys["stranger"], key)  # a key the server does not accept
    shutil.copy(f"{keys['stranger']}.pub", f"{key}.pub")
    r = _status(config, sandbox, cache)
    assert r.returncode == 2 and "authentication failed" in r.stderr, r.stderr
    assert _gone(pid)


def test_changed_options_for_the_same_alias_stop_the_old_master(tmp_path, sandbox, sshd, cache):
    config, _, _ = _own_trust(tmp_path, sshd)
    assert _status(config, sandbox, cache).returncode == 1  # read, not patched
    [first] = sockets(cache)
    pid = master_pid(first)
    config.write_text(config.read_text() + "  ServerAliveInterval 7\n")
    before = sshd.connections()
    assert _status(config, sandbox, cache).returncode == 1  # read, not patched
    assert sshd.connections() == before + 1 and _gone(pid)
    [second] = sockets(cache)
    assert second != first
    assert _status(config, sandbox, cache).returncode == 1 and sshd.connections() == before + 1  # kept; 1: not patched


def test_a_known_hosts_command_gets_no_kept_connection(tmp_path, sandbox, sshd, cache):
    """What a KnownHostsCommand answers is only known by running it for the key the server
    shows, which a kept master never does again: such hosts connect afresh every run."""
    config, known, _ = _own_trust(tmp_path, sshd, extra="")
    config.write_text(
        config.read_text().replace(f"UserKnownHostsFile {known}", "UserKnownHostsFile /dev/null")
        + f"  KnownHostsCommand /bin/cat {known}\n"
    )
    before = sshd.connections()
    for _ in range(2):
        r = _status(config, sandbox, cache)
        assert r.returncode == 1 and "pristine" in r.stdout, r.stderr  # read; 1: not patched
    assert sshd.connections() == before + 2 and sockets(cache) == []

"""Real sshd servers on loopback ports, and the real CLI pointed at them.

tests/conftest.py registers this module as a plugin (its fixtures serve every tier); test
modules import its helpers by name (``remote``, ``start_apply_paused_mid_write``).

``sshd``: one server; ``ssh_config`` gives it aliases, plus aliases that fail on purpose
(``refused``, ``stranger``, ``unknown-key``, ``blackhole``) and one whose sessions pause
the commit mid-write (``slow-writer``). ``fleet``: eight servers, each with its own
``$HOME`` (``nodeN``), so ``--target ~/ml-env`` is eight different installs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from loopback import INSTALL_HINT, SSHD, LoopbackSshd, free_port, keygen, write_ssh_config
from sandbox import make_sandbox, site_packages
from support import CLI, ROOT, WORKER, digest, run_cli

FLEET = 8


@pytest.fixture(scope="session")
def keys(tmp_path_factory) -> dict[str, Path]:
    if SSHD is None:
        pytest.skip(f"no sshd binary; install it with: {INSTALL_HINT}")
    d = tmp_path_factory.mktemp("keys")
    return {"user": keygen(d / "user_ed25519", "loopback-user"), "stranger": keygen(d / "stranger_ed25519", "stranger")}


@pytest.fixture(scope="session")
def sshd(tmp_path_factory, keys):
    with LoopbackSshd(tmp_path_factory.mktemp("sshd"), user_key=keys["user"]) as server:
        yield server


@pytest.fixture(scope="session")
def blackhole():
    """A port that accepts TCP connections (backlog) but never says a word."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


@pytest.fixture(scope="session")
def ssh_config(sshd, keys, blackhole) -> Path:
    wrong = sshd.dir / "wrong_known_hosts"  # another key recorded for this server's address
    wrong.write_text(
        f"[127.0.0.1]:{sshd.port} " + " ".join(Path(f"{keys['stranger']}.pub").read_text().split()[:2]) + "\n"
    )
    return write_ssh_config(
        sshd.dir / "ssh_config",
        [
            sshd.host_block("gpu-box", "127.0.0.1"),
            sshd.host_block("plain-box", connect_timeout=None),  # no ConnectTimeout: the tool sets ssh's own
            sshd.host_block("refused", port=free_port()),
            sshd.host_block("stranger", key=keys["stranger"]),
            sshd.host_block("unknown-key", known_hosts=sshd.dir / "empty_known_hosts"),
            sshd.host_block("changed-key", known_hosts=wrong),
            sshd.host_block("blackhole", port=blackhole, connect_timeout=2),
            sshd.host_block("no-answer", port=blackhole, connect_timeout=None),  # no ConnectTimeout, as most have
            sshd.host_block(
                "interactive-box",
                extra="  RemoteCommand tmux new -A -s main\n  RequestTTY yes\n"
                f"  LocalForward 127.0.0.1:{free_port()} 127.0.0.1:8888\n",
            ),
            sshd.host_block("slow-writer", extra="  SetEnv SPECULATORS_PATCH_FAULT=pause-mid-write\n"),
        ],
    )


@pytest.fixture(scope="session")
def fleet(tmp_path_factory, keys):
    """Eight sshd servers (node1..node8), each giving its sessions its own $HOME, and an
    alias ``dead`` where nothing listens."""
    root = tmp_path_factory.mktemp("fleet")
    with contextlib.ExitStack() as stack:
        servers = []
        for i in range(1, FLEET + 1):
            home = root / f"node{i}" / "home"
            home.mkdir(parents=True)
            servers.append(stack.enter_context(LoopbackSshd(root / f"node{i}", home=home, user_key=keys["user"])))
        blocks = [s.host_block(f"node{i}") for i, s in enumerate(servers, 1)]
        config = write_ssh_config(root / "ssh_config", blocks + [servers[0].host_block("dead", port=free_port())])
        yield servers, config


@pytest.fixture
def fleet_envs(fleet) -> list[Path]:
    """A fresh ``~/ml-env`` sandbox on every node of the fleet."""
    servers, _ = fleet
    envs = []
    for server in servers:
        env = server.home / "ml-env"
        shutil.rmtree(env, ignore_errors=True)
        envs.append(make_sandbox(env))
    return envs


def remote(config: Path, *args: str, env: dict | None = None):
    """The real CLI with ``--ssh-config config``."""
    return run_cli(*args, "--ssh-config", str(config), env=env)


def wait_for(predicate, seconds: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def start_apply_paused_mid_write(ssh_config, there, extra_env=None):
    """Start a remote apply whose agent pauses after writing the first of two files."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(extra_env or {})}
    proc = subprocess.Popen(
        [*CLI, "apply", "--host", "slow-writer", "--target", str(there), "--ssh-config", str(ssh_config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    worker, original = site_packages(there) / WORKER, digest(site_packages(there) / WORKER)
    wait_for(lambda: digest(worker) != original, 60, "the first file to be written")
    return proc

"""Real OpenSSH servers on 127.0.0.1 for tests and benchmarks: throwaway keys, strict
host key checking, a generated ssh_config with aliases. Used by ``tests/ssh/conftest.py``
and ``benchmarks/ssh_roundtrips.py``.

Each server can give its sessions their own ``$HOME`` (sshd ``SetEnv HOME=...``), so
several servers stand for several machines: ``--target ~/ml-env`` is a different install
on each, as it would be on real hosts.

    with LoopbackSshd(workdir, home=node_home) as server:
        config = write_ssh_config(path, [server.host_block("node1")])
        subprocess.run(["ssh", "-F", config, "node1", "true"])
        server.connections()                                # "Accepted publickey" count
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
USER = getpass.getuser()  # sshd runs as this user too; as root it allows root by key only
INSTALL_HINT = "apt-get update && apt-get install -y openssh-server openssh-client"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path


class LoopbackSshd:
    """sshd -D on a random free loopback port, logging to ``<workdir>/sshd.log``."""

    def __init__(
        self, workdir: Path, home: Path | None = None, user_key: Path | None = None, extra_config: str = ""
    ) -> None:
        self.dir = Path(workdir)
        self.home = home
        self.extra_config = extra_config  # more sshd_config lines, e.g. a ForceCommand
        self._user_key = user_key
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.port = free_port()
        self.log = self.dir / "sshd.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LoopbackSshd":
        if SSHD is None:
            raise RuntimeError(f"sshd not installed ({INSTALL_HINT})")
        host_key = keygen(self.dir / "host_ed25519", "loopback-host")
        self.user_key = self._user_key or keygen(self.dir / "user_ed25519", "loopback-user")
        (self.dir / "authorized_keys").write_text(Path(f"{self.user_key}.pub").read_text())
        pub = (self.dir / "host_ed25519.pub").read_text().split()
        self.known_hosts = self.dir / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")
        (self.dir / "empty_known_hosts").write_text("")
        config = self.dir / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
            f"PidFile {self.dir / 'sshd.pid'}\nAuthorizedKeysFile {self.dir / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel VERBOSE\n"
            "AcceptEnv SPECULATORS_PATCH_*\nMaxStartups 64:30:128\nMaxSessions 64\n"
            + (f"SetEnv HOME={self.home}\n" if self.home else "")
            + self.extra_config
        )
        with contextlib.suppress(PermissionError):  # privilege separation directory (as root)
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.proc = subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(self.log)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log.read_text() if self.log.exists() else ''}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening within 10 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def host_block(
        self,
        *aliases: str,
        key: Path | None = None,
        known_hosts: Path | None = None,
        port: int | None = None,
        connect_timeout: int | None = 5,
        extra: str = "",
    ) -> str:
        """An ssh_config ``Host`` block: each alias reaches this server (or ``port``);
        ``connect_timeout=None`` leaves ConnectTimeout unset, as most users' configs do."""
        return (
            f"Host {' '.join(aliases)}\n"
            f"  HostName 127.0.0.1\n  Port {port or self.port}\n  User {USER}\n"
            f"  IdentityFile {key or self.user_key}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
            f"  UserKnownHostsFile {known_hosts or self.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n"
            + (f"  ConnectTimeout {connect_timeout}\n" if connect_timeout is not None else "")
            + extra
        )

    def connections(self) -> int:
        """Connections authenticated so far (one ``Accepted publickey`` line each)."""
        return self.log.read_text().count("Accepted publickey") if self.log.exists() else 0

    def sessions(self) -> list[int]:
        """Pids of the sshd processes serving connections (monitor and session children)."""
        assert self.proc is not None
        return [pid for pid in descendants(self.proc.pid) if _comm(pid) == "sshd"]

    def kill_sessions(self) -> list[int]:
        """SIGKILL every per-connection sshd process: the connections drop mid-flight,
        while the commands they started keep running (as when a network link dies)."""
        pids = self.sessions()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def agents(self) -> list[int]:
        """Pids of the Python processes started over this server's connections."""
        assert self.proc is not None
        return [pid for pid in descendants(self.proc.pid) if _comm(pid).startswith("python")]


def close_masters(folder: Path) -> int:
    """Ask every SSH master connection whose socket is in ``folder`` to exit (``ssh -O
    exit``), as ``--ssh-persist`` leaves them for up to its timeout; returns how many."""
    closed = 0
    for sock in sorted(folder.glob("*")) if folder.is_dir() else []:
        if sock.is_socket():
            closed += (
                subprocess.run(
                    ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "closing"], capture_output=True
                ).returncode
                == 0
            )
    return closed


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def write_ssh_config(path: Path, blocks: list[str]) -> Path:
    path.write_text("\n".join(blocks))
    return path


def _process_parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def descendants(pid: int) -> list[int]:
    """All processes below ``pid``."""
    parents = _process_parents()
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        frontier += kids
    return found

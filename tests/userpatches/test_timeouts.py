"""Issue 23, item 2: no transport waits for ever. The agent must start within
``--connect-timeout`` (default 30 s) and answer each request within ``--timeout`` (default
600 s); past either, one ``error:`` line names what did not answer. A command that sends
our input back (``sh -c cat``) is told at once; one that stays silent, from one that is
only slow to start."""

from __future__ import annotations

import sys
import time

import pytest
from support import PATCHED_FILES, run_cli, tree_digest

HANG = """import json, os, sys, time
size = b''
while not size.endswith(b'\\n'):
    size += os.read(0, 1)
n, buf = int(size), b''
while len(buf) < n:
    buf += os.read(0, n - len(buf))
sys.stdout.write('\\n' + json.loads(buf)['marker'] + '\\n')
sys.stdout.flush()
time.sleep(600)
"""


def _timed(*args: str):
    start = time.monotonic()
    result = run_cli(*args)
    return result, time.monotonic() - start


def _one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_an_exec_command_that_echoes_is_told_at_once(sandbox, site):
    before = tree_digest(site)
    result, took = _timed("status", "--exec", "sh -c cat", "--target", str(sandbox))
    line = _one_line(result)
    assert "--exec 'sh -c cat': it sent our own input back instead of running the agent" in line
    assert took < 10 and tree_digest(site) == before


def test_a_silent_exec_command_fails_at_the_connect_timeout(sandbox, site):
    before = tree_digest(site)
    silent = f"{sys.executable} -c 'import sys; sys.stdin.read()'"
    result, took = _timed("apply", "--exec", silent, "--target", str(sandbox), "--connect-timeout", "2")
    line = _one_line(result)
    assert "no answer within 2 s (--connect-timeout) while starting the agent: it printed nothing" in line
    assert 2 <= took < 10 and tree_digest(site) == before


def test_a_wrapper_whose_child_holds_the_pipe_fails_at_the_connect_timeout(sandbox, site):
    """A shell (sudo, a container wrapper) that forks a child which never reads: the child
    keeps the pipe open after the wrapper is killed; the run still ends at the bound (it
    waited for the child, 60 s here, before the write to the pipe stopped holding stdin)."""
    before = tree_digest(site)
    result, took = _timed("status", "--exec", "sh -c 'sleep 60; :'", "--target", str(sandbox), "--connect-timeout", "2")
    line = _one_line(result)
    assert "no answer within 2 s (--connect-timeout) while starting the agent" in line
    assert 2 <= took < 10 and tree_digest(site) == before


def test_a_slow_exec_command_is_waited_for(tmp_path, sandbox):
    """Slow to start (3 s, a container pulling its image), within the connect timeout: it works."""
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\nsleep 3\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    result, took = _timed("status", "--exec", str(slow), "--target", str(sandbox), "--connect-timeout", "10")
    assert result.returncode == 1 and "speculators 0.3.0" in result.stdout, result.stderr  # read, not patched
    assert took >= 3


def test_an_agent_that_stops_answering_fails_at_the_timeout(tmp_path, sandbox, site):
    hang = tmp_path / "hang.py"
    hang.write_text(HANG)
    before = tree_digest(site)
    result, took = _timed("verify", "--exec", f"{sys.executable} {hang}", "--timeout", "2")
    line = _one_line(result)
    assert "no answer to inspect within 2 s (--timeout); nothing was written by this run" in line
    assert 2 <= took < 10 and tree_digest(site) == before


def test_a_local_commit_that_outlives_the_timeout_is_waited_for_and_reported(sandbox, site):
    """The agent pauses 4 s between two file writes; with --timeout 1 the commit, which holds
    the lock and is writing, is waited for (the CLI says so at once) and reported as done:
    a command never says it failed while its commit goes on (issue 37, item 1)."""
    result = run_cli(
        "apply",
        "--target",
        str(sandbox),
        "--timeout",
        "1",
        env={"SPECULATORS_PATCH_FAULT": "pause-mid-write", "SPECULATORS_PATCH_FAULT_SECONDS": "4"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(
        "local: no answer to the commit within 1 s (--timeout): it holds the lock and is writing; waiting up to "
        "60 s more for it to finish\n"
    ), result.stderr
    assert f"patched {len(PATCHED_FILES)} file(s)" in result.stdout
    _wait_until_whole(site, 0)
    status = run_cli("status", "--target", str(sandbox))
    assert ": patched" in status.stdout and ": modified" not in status.stdout


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_timeout_is_one_error_line(sandbox, value):
    for option in ("--timeout", "--connect-timeout"):
        line = _one_line(run_cli("status", "--target", str(sandbox), option, value))
        assert option in line


def _wait_until_whole(site, seconds: float = 20.0) -> None:
    """Until the commit has finished: no journal, no temporary file (``seconds``: 0 checks once)."""
    deadline = time.monotonic() + seconds
    while True:
        state = site / ".speculators-patch"
        if (
            not (state / "journal.json").exists()
            and not list(site.rglob("*.speculators-patch.tmp"))
            and not list(site.rglob("*.speculators-patch.old"))
        ):
            return
        if time.monotonic() >= deadline:
            raise AssertionError("the commit did not finish")
        time.sleep(0.2)


def test_a_local_interpreter_that_never_starts_fails_at_the_connect_timeout(tmp_path):
    """Locally too: a "python" that hangs before running anything (a wedged NFS home, a
    wrapper waiting on a lock) is one line after --connect-timeout, not a hang."""
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nsleep 600\n")
    fake.chmod(0o755)
    result, took = _timed("status", "--target", str(fake), "--connect-timeout", "2")
    line = _one_line(result)
    assert (
        f"local: {fake}: no answer within 2 s (--connect-timeout) while starting the agent: it printed nothing" in line
    )
    assert took < 10

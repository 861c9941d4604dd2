"""Issue 23, item 5: what a new user copies from the output acts on what was checked, and
every message says what happened: the fix column names the target; no target and no active
environment is said to be the tool's own; ``new``'s hint works where pytest is missing;
Ctrl-C says whether anything changed; a hosts file's bad line is named; a full revert
leaves no state directory; piped tables carry no trailing spaces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox import make_sandbox
from support import CLI, PATCHED_FILES, ROOT, run_cli, run_json


def _one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_the_fix_column_names_the_target_it_checked(sandbox):
    code, report = run_json("verify", "--target", str(sandbox))
    hints = {r["hint"] for r in report["patches"] if r["verdict"] == "missing"}
    assert code == 1 and hints == {f"speculators-patch apply --target {sandbox}"}


def test_no_target_and_no_active_environment_names_the_tools_own(tmp_path):
    result = run_cli("status", env={"VIRTUAL_ENV": "", "CONDA_PREFIX": ""})
    line = _one_line(result)
    assert result.returncode == 2
    assert (
        f"no speculators installed in {Path(sys.executable).parent.parent}, the environment speculators-patch "
        "itself runs in" in line
    )
    assert "pass --target PATH" in line


def test_new_hint_installs_pytest_where_the_tool_has_none(tmp_path):
    """After `pip install .` the tool's Python has no pytest: the hint says to install it."""
    blocker = (
        "import importlib.abc, sys\n"
        "class NoPytest(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pytest' or name.startswith('pytest.') or name == '_pytest':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, NoPytest())\n"
        "from patcher.cli import main\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    without = subprocess.run(
        [
            sys.executable,
            "-c",
            blocker,
            "new",
            "FIX001",
            "--file",
            "speculators/data_generation/logging_utils.py",
            "-o",
            str(tmp_path / "a" / "fix001.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert without.returncode == 0, without.stderr
    assert f"`{sys.executable} -m pip install pytest`" in without.stdout
    with_pytest = run_cli(
        "new",
        "FIX001",
        "--file",
        "speculators/data_generation/logging_utils.py",
        "-o",
        str(tmp_path / "b" / "fix001.py"),
    )
    assert "pip install pytest" not in with_pytest.stdout and f"`{sys.executable} -m pytest " in with_pytest.stdout


def _reset_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _interrupt_when(
    args: list[str], ready, env: dict | None = None, sig: int = signal.SIGINT
) -> subprocess.CompletedProcess:
    """Start the CLI in its own process group, wait for ``ready()``, then send ``sig`` to the
    whole group, as a terminal's Ctrl-C (SIGINT), a closed terminal (SIGHUP) or a service
    manager's stop (SIGTERM) does: the local agent gets it too. Signals start at their
    default, as under an interactive shell, even where this run inherited them ignored
    (``nohup``, a background job, a pytest-xdist worker)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen(
        [*CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full,
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=_reset_signals,
    )
    deadline = time.monotonic() + 60
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP")],
    ids=["ctrl-c", "sigterm", "sighup"],
)
def test_ctrl_c_during_a_commit_waits_for_it_and_says_it_finished(sandbox, site, sig, code, said):
    journal = site / ".speculators-patch" / "journal.json"
    result = _interrupt_when(
        ["apply", "--target", str(sandbox)],
        journal.exists,
        env={"SPECULATORS_PATCH_FAULT": "pause-mid-write", "SPECULATORS_PATCH_FAULT_SECONDS": "2"},
        sig=sig,
    )
    assert result.returncode == code, result.stderr
    line = _one_line(result)
    assert (
        f"interrupted ({said}) while" in line
        and f"the commit was finished first: {len(PATCHED_FILES)} file(s) written" in line
    ), line
    status = run_cli("status", "--target", str(sandbox))
    assert status.returncode == 0 and status.stdout.count(": patched") == len(PATCHED_FILES)


def test_ctrl_c_before_a_commit_says_nothing_changed(sandbox, site, tmp_path):
    started = tmp_path / "started"
    slow = tmp_path / "slow-python"
    went_on = tmp_path / "went-on"  # the command's Python would have started
    slow.write_text(f'#!/bin/sh\ntouch {started}\nsleep 30\ntouch {went_on}\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    result = _interrupt_when(["apply", "--exec", str(slow), "--target", str(sandbox)], started.exists)
    assert result.returncode == 130 and result.stderr.startswith("error: ")  # no blank line first
    assert _one_line(result) == "error: interrupted (Ctrl-C) before anything was written: nothing changed"
    assert not (site / ".speculators-patch").exists()
    # The --exec command (its own process group) got the Ctrl-C too: the CLI did not wait for
    # it to finish its sleep and start the agent.
    assert not went_on.exists()


@pytest.mark.parametrize("at", ["verify", "print"])
def test_ctrl_c_after_a_commit_says_what_this_run_wrote(sandbox, site, at):
    """Ctrl-C while ``apply`` checks what it just wrote, or while it prints its report: the one
    line names the files its commit wrote (the run's session keeps them), and the install is
    patched. (It once said "nothing changed" when the Ctrl-C came during the printing.)"""
    result = subprocess.run(
        [sys.executable, "-m", "ctrl_c_after_commit", "apply", "--target", str(sandbox)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "CTRL_C_AT": at},
    )
    assert result.returncode == 130 and result.stderr.startswith("error: "), result.stderr  # no blank line first
    line = _one_line(result)
    assert line.startswith("error: interrupted (Ctrl-C) after this run's commit: ") and line.endswith(
        f"{len(PATCHED_FILES)} file(s) written ({', '.join(sorted(PATCHED_FILES))})"
    ), line
    status = run_cli("status", "--target", str(sandbox))
    assert status.returncode == 0 and status.stdout.count(": patched") == len(PATCHED_FILES)


def test_ctrl_c_during_a_fleet_summary_never_says_nothing_changed(tmp_path):
    """Over two hosts, Ctrl-C as the summary table is printed, after both committed: the one
    line says every host answered (their lines above say what each did), never "nothing
    changed"; both installs are patched."""
    envs = [make_sandbox(tmp_path / name) for name in ("a", "b")]
    targets = [a for env in envs for a in ("--exec", str(env / "bin" / "python"))]
    result = subprocess.run(
        [sys.executable, "-m", "ctrl_c_after_commit", "apply", *targets],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "CTRL_C_AT": "summary"},
    )
    assert result.returncode == 130, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "error: interrupted (Ctrl-C) while the summary was printed, after every host answered: "
        "each host's line above says what it did"
    ), result.stderr
    assert result.stderr.count("changed ") == 2, result.stderr  # each host's own line, before it
    for env in envs:
        assert run_cli("status", "--target", str(env)).returncode == 0


def test_a_bad_line_in_a_hosts_file_is_named(tmp_path):
    hosts = tmp_path / "nodes.txt"
    for content, says in (
        (b"node1\n# spare\ngpu box\n", f"{hosts}:3: not a host: 'gpu box'"),
        (b"node1\nno\0de\n", f"{hosts}:2: not text (a NUL byte)"),
        (b"node1\nn\xffde\n", f"{hosts}:2: not UTF-8 text"),
    ):
        hosts.write_bytes(content)
        result = run_cli("status", "--hosts-file", str(hosts))
        assert result.returncode == 2 and _one_line(result).startswith(f"error: {says}"), result.stderr


def test_a_full_revert_leaves_no_state_directory(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    assert (site / ".speculators-patch" / "lock").exists()
    assert run_cli("revert", "--target", str(sandbox)).returncode == 0
    assert not (site / ".speculators-patch").exists()  # no lock, no empty pristine/
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0  # and the next commit makes it again


def test_piped_tables_carry_no_trailing_spaces(sandbox):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    for args in (("status", "--target", str(sandbox)), ("verify", "--target", str(sandbox)), ("list",)):
        out = run_cli(*args).stdout
        assert out.strip() and [line for line in out.splitlines() if line != line.rstrip()] == [], args


@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [("SIGINT", 130, "Ctrl-C"), ("SIGTERM", 143, "SIGTERM"), ("SIGHUP", 129, "SIGHUP")],
)
def test_ctrl_c_while_the_command_line_loads_is_one_line(sandbox, site, sig, code, said):
    """Issue 30 item 8: Ctrl-C 0.03 s in lands while click and rich are imported; it is one
    line and exit 130 there too (here it lands exactly there: the signal as the import of click
    starts). SIGTERM and SIGHUP alike, named as themselves (issue 37)."""
    program = (
        "import builtins, os, signal, sys\n"
        "for s in ('SIGTERM', 'SIGHUP'): signal.signal(getattr(signal, s), signal.SIG_DFL)\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "real = builtins.__import__\n"
        "def interrupted(name, *args, **kwargs):\n"
        "    if name == 'click':\n"
        f"        os.kill(os.getpid(), signal.{sig})\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = interrupted\n"
        "sys.argv[0] = 'speculators-patch'\n"
        "from patcher.cli import console\n"
        "console()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for json_flag in ((), ("--json",)):
        result = subprocess.run(
            [sys.executable, "-c", program, "apply", "--target", str(sandbox), *json_flag],
            capture_output=True,
            text=True,
            env=env,
        )
        assert result.returncode == code, result.stderr
        if json_flag:
            assert json.loads(result.stdout)["exit_code"] == code and result.stderr == ""
        else:
            assert _one_line(result) == f"error: interrupted ({said}) before anything was written: nothing changed"
    assert not (site / ".speculators-patch").exists()


def test_diff_says_why_it_shows_nothing_on_a_file_changed_after_patching(sandbox, site):
    """Issue 30 item 8: apply refuses to touch a hand-edited patched file; diff said nothing."""
    from support import GENERATOR

    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    with (site / GENERATOR).open("a") as f:
        f.write("# edited by hand\n")
    result = run_cli("diff", "--target", str(sandbox))
    assert (result.returncode, result.stdout) == (1, "")
    [line] = result.stderr.splitlines()  # one line, on stderr: stdout stays a diff
    assert line.startswith(f"no diff: {GENERATOR} changed after patching, so apply leaves it as it is")
    assert f"speculators-patch apply --target {sandbox} --adopt" in line and "--force" in line
    code, data = run_json("diff", "--target", str(sandbox))
    assert code == 1 and data["modified_files"] == [GENERATOR] and data["diff"] == ""


def test_revert_after_a_pip_upgrade_names_repair_which_cleans_it_up(sandbox, site):
    """Issue 30 item 8: after `pip install --force-reinstall speculators==0.4.0.1` over a patched
    0.3.0, revert refuses (no 0.3.0 bytes over 0.4.0.1) and names repair, which drops the record."""
    from sandbox import pip_install

    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    pip_install(sandbox, "speculators", "0.4.0.1", force=True)
    result = run_cli("revert", "--target", str(sandbox))
    assert result.returncode == 2 and f"`speculators-patch repair --target {sandbox}` drops that record" in _one_line(
        result
    )
    repaired = run_cli("repair", "--target", str(sandbox))
    assert repaired.returncode == 0 and "repaired:" in repaired.stdout, repaired.stdout
    assert not (site / ".speculators-patch").exists()
    assert run_cli("revert", "--target", str(sandbox)).returncode == 0

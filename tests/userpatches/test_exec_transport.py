"""``--exec 'CMD ...'`` through real process boundaries available here: ``env -i`` (an empty
environment) and ``unshare`` (new mount and PID namespaces; in one, a tmpfs hides the
user's patch file from the far side). The bytes must be the local ones."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest
from sandbox import make_sandbox, site_packages
from support import GENERATOR, ROOT, run_cli, run_json, tree_digest
from userfix import FIX001_LINE, write_fix001


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--mount", "--pid", "--fork", "true"], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


needs_unshare = pytest.mark.skipif(not _can_unshare(), reason="unshare --mount --pid needs root or user namespaces")


def isolated(python, hide: str | None = None) -> str:
    """An --exec command: ``python`` in new mount and PID namespaces with an empty
    environment; with ``hide``, a tmpfs mounted over that directory first."""
    inner = f"env -i {shlex.quote(str(python))}"
    if hide is None:
        return f"unshare --mount --pid --fork {inner}"
    script = f'mount -t tmpfs tmpfs {shlex.quote(hide)} && exec "$0" "$@"'
    return f"unshare --mount --pid --fork sh -c {shlex.quote(script)} env -i {shlex.quote(str(python))}"


@needs_unshare
def test_apply_through_exec_writes_the_local_bytes(tmp_path):
    here, there = make_sandbox(tmp_path / "here"), make_sandbox(tmp_path / "there")
    code, remote = run_json("apply", "--exec", isolated(there / "bin" / "python"))
    assert code == 0 and remote["exchanges"] == 2 and GENERATOR in remote["written"]
    assert remote["target"] == isolated(there / "bin" / "python")
    code, local = run_json("apply", "--target", str(here))
    assert code == 0
    assert tree_digest(site_packages(there)) == tree_digest(site_packages(here))  # files, manifest, pristine copies
    for command in ("status", "diff", "verify"):
        r = run_cli(command, "--exec", isolated(there / "bin" / "python"), "--json")
        local = run_cli(command, "--target", str(here), "--json")
        assert r.returncode == local.returncode == 0, (r.stderr, local.stderr)
        same = json.loads(r.stdout.replace(str(there), str(here)))
        assert {k: v for k, v in same.items() if k != "target"} == {
            k: v for k, v in json.loads(local.stdout).items() if k != "target"
        }


@needs_unshare
def test_user_patch_applies_through_exec_where_the_file_is_not_visible(tmp_path):
    controller = tmp_path / "controller"
    fix = write_fix001(controller)
    there = make_sandbox(tmp_path / "there")
    command = isolated(there / "bin" / "python", hide=str(controller))
    probe = subprocess.run(
        [*shlex.split(command), "-c", f"import os; print(os.path.exists({str(fix)!r}))"], capture_output=True, text=True
    )
    assert probe.stdout.strip() == "False", probe.stderr  # the far side cannot see the file
    code, report = run_json("apply", "--exec", command, "--patch-file", str(fix))
    assert code == 0 and [p["state"] for p in report["patches"] if p["id"] == "FIX001"] == ["applied-now"]
    assert FIX001_LINE in (site_packages(there) / GENERATOR).read_text()
    assert run_cli("revert", "--exec", command, "--only", "FIX001").returncode == 0
    assert FIX001_LINE not in (site_packages(there) / GENERATOR).read_text()


def test_target_is_resolved_on_the_far_side(tmp_path, sandbox, site):
    code, report = run_json("apply", "--exec", "env -i python3", "--target", str(sandbox))
    assert code == 0 and report["site_packages"] == str(site)
    result = run_cli("status", "--exec", "env -i python3", "--target", str(tmp_path / "no such env"))
    assert result.returncode == 2
    assert result.stderr == f"error: target does not exist on env -i python3: {tmp_path / 'no such env'}\n"


def test_the_far_side_resolves_a_target_by_the_local_rule(tmp_path, sandbox, site):
    """No --target: that side's $VIRTUAL_ENV (then $CONDA_PREFIX), as locally; a file not
    named like a Python is refused before anything is sent to it; the caller's PYTHONPATH,
    here a decoy speculators, never decides which tree is read."""
    decoy = tmp_path / "decoy"
    (decoy / "speculators").mkdir(parents=True)
    (decoy / "speculators" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    for variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        far = f"env -i {variable}={shlex.quote(str(sandbox))} PYTHONPATH={shlex.quote(str(decoy))} python3"
        code, report = run_json("status", "--exec", far)
        assert code == 1 and report["site_packages"] == str(site) and report["speculators"] == "0.3.0", variable
        local = run_json("status", env={variable: str(sandbox), "PYTHONPATH": f"{decoy}:{ROOT}"})
        assert local[1]["site_packages"] == str(site) and local[1]["speculators"] == "0.3.0", variable
    gone = run_cli("status", "--exec", f"env -i VIRTUAL_ENV={shlex.quote(str(tmp_path / 'gone'))} python3")
    assert gone.returncode == 2 and gone.stderr.startswith("error: $VIRTUAL_ENV on env -i VIRTUAL_ENV=")
    assert "which has no bin/python; pass --target" in gone.stderr
    for where in (("--exec", "env -i python3"), ()):
        refused = run_cli("status", *where, "--target", "/bin/true")
        assert (
            refused.returncode == 2
            and "is a file but not a Python interpreter (python3, python3.X): /bin/true" in refused.stderr
        ), refused.stderr


def test_a_far_side_failure_names_the_interpreter_the_rule_chose(tmp_path):
    """The command started a Python, the target's "python3" did not run the agent: the message
    names that interpreter and what it said, not the --exec command; a Python started without
    PATH (no sys.executable) and no --target is told to pass one."""
    fake = tmp_path / "fake" / "python3"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho hello from a fake python\n")
    fake.chmod(0o755)
    result = run_cli("status", "--exec", "env -i python3", "--target", str(fake))
    assert result.returncode == 2 and result.stderr == (
        f"error: --exec 'env -i python3': {fake} (the target's interpreter there) ended (status 0) without starting "
        f"the agent: hello from a fake python; is it a Python 3.8+ interpreter?\n"
    )
    bare = run_cli("status", "--exec", "env -i python3")  # env finds python3 by its default path; Python has none
    assert bare.returncode == 2 and "cannot tell its own path (sys.executable is empty" in bare.stderr, bare.stderr


def test_several_commands_give_the_per_target_summary(tmp_path):
    one, two = make_sandbox(tmp_path / "one"), make_sandbox(tmp_path / "two")
    result = run_cli(
        "apply",
        "--exec",
        f"env -i {one}/bin/python",
        "--exec",
        f"env -i {two}/bin/python",
        "--exec",
        "no-such-command-here",
        "--json",
    )
    assert result.returncode == 2, result.stderr  # one target failed; the others are done
    hosts = {h["host"]: h for h in json.loads(result.stdout)["hosts"]}
    assert hosts[f"env -i {one}/bin/python"]["outcome"] == "changed"
    assert hosts[f"env -i {two}/bin/python"]["outcome"] == "changed"
    assert (
        hosts["no-such-command-here"]["reason"]
        == "--exec 'no-such-command-here': no-such-command-here: command not found"
    )
    assert tree_digest(site_packages(one)) == tree_digest(site_packages(two))
    again = run_cli("apply", "--exec", f"env -i {one}/bin/python", "--exec", f"env -i {two}/bin/python")
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == "2 hosts: 2 unchanged"


BAD = [
    pytest.param(
        "no-such-command-here -i",
        "error: --exec 'no-such-command-here -i': no-such-command-here: command not found",
        id="not found",
    ),
    pytest.param(
        "false",
        "error: --exec 'false': the command ended (status 1) while reading: no output; the command must "
        "start a Python 3.8+",
        id="fails",
    ),
    pytest.param(
        "sh",
        "error: --exec 'sh': the command ended (status 2) while reading: sh: 1: Syntax error",
        id="a shell, not Python",
    ),
    pytest.param(
        "sh -c 'echo pyenv: python2: command not found >&2; echo its advice >&2; exit 127'",
        "error: --exec \"sh -c 'echo pyenv: python2: command not found >&2; echo its advice >&2; exit 127'\": "
        "the command ended (status 127) while reading: pyenv: python2: command not found;",
        id="a wrapper that finds no such command (status 127): its first line, not its last",
    ),
    pytest.param(
        "'unclosed",
        'error: --exec "\'unclosed": cannot split it into arguments (No closing quotation)',
        id="unsplittable",
    ),
    pytest.param("", "error: --exec is empty", id="empty"),
]


@pytest.mark.parametrize("command, says", BAD)
def test_a_command_that_fails_or_is_missing_is_one_error_line(sandbox, site, command, says):
    before = tree_digest(site)
    result = run_cli("apply", "--exec", command, "--target", str(sandbox))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(says) and len(result.stderr.splitlines()) == 1, result.stderr
    assert tree_digest(site) == before


def test_nothing_reaches_a_shell_on_our_side(tmp_path, sandbox):
    marker = tmp_path / "pwned"
    result = run_cli("status", "--exec", f"env -i python3; touch {marker}", "--target", str(sandbox))
    assert result.returncode == 2 and not marker.exists()  # ';' is an argument for env, not a command separator

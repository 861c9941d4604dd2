"""Remote targets over a real loopback sshd give what local targets give, byte for byte."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from loopback import USER, LoopbackSshd, write_ssh_config
from sandbox import make_sandbox, site_packages
from sshfixtures import remote
from support import GENERATOR, PATCHED_FILES, run_cli, tree_digest

pytestmark = pytest.mark.ssh


def _json(result) -> dict:
    assert result.returncode in (0, 1), (result.stdout, result.stderr)
    return json.loads(result.stdout)


MAX_EXCHANGES = 3  # per subcommand and host, whatever the number of patches or files


def _same_report(remote_report: dict, local_report: dict) -> None:
    """Reports equal but for the target's label and the ways out they name, which name the
    host they were checked on (the fix column, the life-cycle check's fix); the same (small)
    number of exchanges."""

    def strip(report):
        rows = [{k: v for k, v in r.items() if k != "hint"} for r in report.get("patches", [])]
        kept = {**{k: v for k, v in report.items() if k != "target"}, "patches": rows}
        return json.loads(re.sub(r" --host gpu-box| --ssh-config [^ \"]+", "", json.dumps(kept)))

    assert strip(remote_report) == strip(local_report)
    for row in remote_report.get("patches", []):
        if "speculators-patch apply" in row.get("hint", ""):
            assert "--host gpu-box" in row["hint"], row  # copied from the output, it patches that host
    assert remote_report["exchanges"] <= MAX_EXCHANGES


def test_apply_remote_equals_local(tmp_path, sshd, ssh_config):
    here, there = make_sandbox(tmp_path / "here"), make_sandbox(tmp_path / "there")
    connections = sshd.connections()
    r = _json(remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(there), "--json"))
    assert sshd.connections() - connections == 1
    assert r["exchanges"] == 2 and sorted(r["written"]) == PATCHED_FILES
    local = _json(run_cli("apply", "--target", str(here), "--json"))
    # Same files, same hashes: the patched modules, the manifest and the pristine backups.
    assert tree_digest(site_packages(there)) == tree_digest(site_packages(here))
    assert [p["state"] for p in r["patches"]] == [p["state"] for p in local["patches"]]


def test_a_config_without_connect_timeout_works(sandbox, sshd, ssh_config):
    """Most ssh_configs set no ConnectTimeout: the tool then passes ssh one it accepts (whole
    seconds; ``ConnectTimeout=30.0`` made every such connection fail)."""
    r = remote(
        ssh_config,
        "status",
        "--host",
        "plain-box",
        "--target",
        str(sandbox),
        "--json",
        env={"SPECULATORS_PATCH_SSH_PERSIST": "0"},
    )
    assert r.returncode == 1, r.stderr  # read, not patched
    assert set(json.loads(r.stdout)["files"].values()) == {"pristine"}
    r = remote(ssh_config, "status", "--host", "plain-box", "--target", str(sandbox), "--connect-timeout", "7.5")
    assert r.returncode == 1, r.stderr  # read, not patched


def test_diff_status_verify_remote_equal_local_on_the_same_sandbox(sandbox, sshd, ssh_config):
    for command, code in (("diff", 1), ("status", 1), ("verify", 1)):
        r = remote(ssh_config, command, "--host", "gpu-box", "--target", str(sandbox), "--json")
        local = run_cli(command, "--target", str(sandbox), "--json")
        assert (r.returncode, local.returncode) == (code, code), (command, r.stderr, local.stderr)
        _same_report(json.loads(r.stdout), json.loads(local.stdout))
    before = tree_digest(sandbox)
    r = remote(ssh_config, "diff", "--host", "gpu-box", "--target", str(sandbox))
    assert r.stdout == run_cli("diff", "--target", str(sandbox)).stdout and r.stdout.startswith("--- a/")
    assert tree_digest(sandbox) == before  # reading wrote nothing


@pytest.mark.parametrize("form", ["prefix", "interpreter", "site-packages"])
def test_every_target_form_resolves_on_the_remote_side(tmp_path, sshd, ssh_config, form):
    here, there = make_sandbox(tmp_path / "here"), make_sandbox(tmp_path / "there")
    target = {"prefix": there, "interpreter": there / "bin" / "python", "site-packages": site_packages(there)}[form]
    r = _json(remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(target), "--json"))
    assert r["speculators_root"] == str(site_packages(there))
    if form == "site-packages":
        assert r["python"] == "/usr/bin/python3" or not r["python"].startswith(str(there))
    else:
        assert r["python"].startswith(str(there))
    _json(run_cli("apply", "--target", str(here), "--json"))
    assert tree_digest(site_packages(there)) == tree_digest(site_packages(here))


def test_apply_only_one_patch(tmp_path, sshd, ssh_config):
    here, there = make_sandbox(tmp_path / "here"), make_sandbox(tmp_path / "there")
    r = _json(remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(there), "--only", "SP001", "--json"))
    local = _json(run_cli("apply", "--target", str(here), "--only", "SP001", "--json"))
    assert r["written"] == local["written"] == [GENERATOR]
    assert tree_digest(site_packages(there)) == tree_digest(site_packages(here))


def test_user_at_address_colon_port(tmp_path, sshd, ssh_config):
    there = make_sandbox(tmp_path / "there")
    r = _json(remote(ssh_config, "status", "--host", f"{USER}@127.0.0.1:{sshd.port}", "--target", str(there), "--json"))
    assert r["speculators"] == "0.3.0"


def test_remote_command_tty_and_forwards_in_the_config_are_not_used(sandbox, sshd, ssh_config):
    """A host set up for interactive use (RemoteCommand tmux, RequestTTY, LocalForward)."""
    r = _json(remote(ssh_config, "status", "--host", "interactive-box", "--target", str(sandbox), "--json"))
    assert r["speculators"] == "0.3.0"


def test_a_chatty_login_shell_does_not_confuse_the_protocol(tmp_path, keys, sandbox):
    """rc files that print (banners, conda init, JSON-looking lines) before our command runs."""
    home = tmp_path / "home"
    home.mkdir()
    noise = 'echo "Welcome to gpu-box"\necho \'{"ok": "not the agent"}\'\nprintf "no newline"\n'
    for rc in (".bashrc", ".zshenv", ".profile"):
        (home / rc).write_text(noise)
    with LoopbackSshd(tmp_path / "sshd", home=home, user_key=keys["user"]) as server:
        config = write_ssh_config(tmp_path / "ssh_config", [server.host_block("chatty")])
        shell = subprocess.run(["ssh", "-F", str(config), "chatty", "true"], capture_output=True, text=True)
        if "Welcome" not in shell.stdout:
            pytest.skip("the login shell here reads no rc file for ssh commands")
        r = _json(remote(config, "apply", "--host", "chatty", "--target", str(sandbox), "--json"))
        assert sorted(r["written"]) == PATCHED_FILES


def test_revert_over_ssh_restores_the_wheel_bytes(sandbox, sshd, ssh_config):
    before = tree_digest(site_packages(sandbox) / "speculators")
    _json(remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(sandbox), "--json"))
    assert tree_digest(site_packages(sandbox) / "speculators") != before
    r = _json(remote(ssh_config, "revert", "--host", "gpu-box", "--target", str(sandbox), "--json"))
    assert r["exchanges"] == 2
    assert tree_digest(site_packages(sandbox) / "speculators") == before


HOSTILE = "we ird 'single' \"double\"; touch {canary}; $(touch {canary}) `touch {canary}` & | > <"


def test_hostile_target_path_works_and_runs_nothing(tmp_path, sshd, ssh_config):
    canary = tmp_path / "CANARY"
    weird = tmp_path / HOSTILE.format(canary=canary) / "env"
    here, there = make_sandbox(tmp_path / "here"), make_sandbox(weird)
    r = _json(remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(there), "--json"))
    assert sorted(r["written"]) == PATCHED_FILES
    _json(run_cli("apply", "--target", str(here), "--json"))
    assert tree_digest(site_packages(there)) == tree_digest(site_packages(here))
    assert not canary.exists()


def test_hostile_missing_target_is_refused_and_runs_nothing(tmp_path, sshd, ssh_config):
    canary = tmp_path / "CANARY"
    r = remote(ssh_config, "apply", "--host", "gpu-box", "--target", HOSTILE.format(canary=canary))
    assert r.returncode == 2 and "target does not exist on gpu-box" in r.stderr, r.stderr
    assert not canary.exists()


@pytest.mark.parametrize(
    "host",
    [
        "-oProxyCommand=touch {canary}",
        "gpu-box;touch {canary}",
        "$(touch {canary})",
        "gpu box",
        "gpu-box\ntouch {canary}",
        "user@-oProxyCommand=x",
        "root@gpu-box:99999",
    ],
    ids=["option", "semicolon", "substitution", "space", "newline", "option-after-user", "bad-port"],
)
def test_hostile_host_is_refused_before_ssh_runs(tmp_path, ssh_config, host):
    canary = tmp_path / "CANARY"
    r = remote(ssh_config, "status", "--host", host.format(canary=canary), "--target", "/nonexistent")
    assert r.returncode == 2 and "not a host" in r.stderr, r.stderr
    assert not canary.exists()


def test_check_draft_remote_equals_local(tmp_path, sshd, ssh_config):
    """``check-draft`` over SSH reads the draft, its verifier and vLLM on the host, as locally."""
    from drafts import write_data_config, write_draft, write_verifier

    env = make_sandbox(tmp_path / "serving", None, "0.16.0", link=True)
    draft = write_draft(tmp_path / "checkpoints" / "0", write_verifier(tmp_path / "verifier"))
    args = ("check-draft", str(draft), "--data-config", str(write_data_config(tmp_path / "data")), "--target", str(env))
    there = remote(ssh_config, *args, "--host", "gpu-box", "--json")
    here = run_cli(*args, "--json")
    assert there.returncode == here.returncode == 0, there.stderr
    assert json.loads(there.stdout) == json.loads(here.stdout)
    assert json.loads(there.stdout)["served"]["aux_layers"] == [3, 5, 6]

"""Bad input: a one-line error, exit code 2, and nothing changed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import GENERATOR, run_cli, tree_digest


def assert_refused(result, *fragments: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_missing_target(tmp_path):
    assert_refused(run_cli("apply", "--target", str(tmp_path / "nope")), "target does not exist")


def test_a_dangling_link_as_target_is_named_as_one(tmp_path):
    link = tmp_path / "env"
    link.symlink_to(tmp_path / "moved-away")
    assert_refused(
        run_cli("status", "--target", str(link)),
        f"target is a symbolic link to {tmp_path / 'moved-away'}, which does not exist: {link}",
    )


@pytest.mark.parametrize("target", ["me@gpu-box:/opt/env", "ssh://me@gpu-box/opt/env"])
def test_a_remote_path_as_target_names_host(target):
    """scp's or ssh's way of naming a remote env: refused, with --host as the way."""
    proc = run_cli("status", "--target", target)
    assert_refused(proc, "target does not exist: ", "; for a remote env pass --host me@gpu-box --target /opt/env")


def test_target_is_not_an_environment(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert_refused(run_cli("status", "--target", str(tmp_path)), "not a Python environment")


def test_no_speculators_in_target(tmp_path):
    from sandbox import make_sandbox

    env = make_sandbox(tmp_path / "env", speculators=None)
    assert_refused(run_cli("apply", "--target", str(env)), "no speculators installed")


@pytest.mark.parametrize("version", ["0.5.0", "0.2.0"])
def test_speculators_without_patches_is_left_alone(tmp_path, version):
    """0.5.0 generates through a vLLM server client, 0.2.0 predates the generator: the tool
    has no patches for them and says so, without claiming they work."""
    from sandbox import make_sandbox, site_packages

    env = make_sandbox(tmp_path / "env", speculators=version)
    before = tree_digest(site_packages(env))
    for command in ("apply", "diff", "verify", "status", "selftest"):
        proc = run_cli(command, "--target", str(env))
        assert_refused(proc, f"speculators {version} is not supported: speculators-patch has no patches for it")
        assert "without patches" not in proc.stderr and "support vLLM" not in proc.stderr
    assert tree_digest(site_packages(env)) == before


def test_unknown_patch_id(sandbox, site):
    before = tree_digest(site)
    assert_refused(run_cli("apply", "--target", str(sandbox), "--only", "SP999"), "unknown patch id SP999")
    assert tree_digest(site) == before


def test_syntax_error_in_target_file(sandbox, site):
    path = site / GENERATOR
    path.write_text(path.read_text() + "\ndef broken(:\n")
    before = tree_digest(site)
    assert_refused(run_cli("apply", "--target", str(sandbox)), GENERATOR, "syntax error")
    assert tree_digest(site) == before


def test_unrecognised_code_is_refused_with_file_and_line(sandbox, site):
    path = site / GENERATOR
    path.write_text(path.read_text().replace("SchedulerConfig(\n", "make_scheduler_config(\n"))
    before = tree_digest(site)
    result = run_cli("apply", "--target", str(sandbox))
    assert_refused(result, GENERATOR, "SchedulerConfig(...)")
    assert tree_digest(site) == before


def test_modified_after_patching_is_not_overwritten(sandbox, site):
    run_cli("apply", "--target", str(sandbox))
    path = site / GENERATOR
    path.write_text(path.read_text() + "\n# a local edit\n")
    before = tree_digest(site)
    assert_refused(run_cli("revert", "--target", str(sandbox)), "modified after patching", "--force")
    assert tree_digest(site) == before
    assert run_cli("revert", "--target", str(sandbox), "--force").returncode == 0
    assert "# a local edit" not in path.read_text()


def _mount_read_only(path: Path) -> bool:
    """Bind-mount ``path`` read-only onto itself; False where mounting is not allowed."""
    ok = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True).returncode == 0
    if ok and subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True).returncode == 0:
        return True
    if ok:
        subprocess.run(["umount", str(path)])
    return False


def test_read_only_site_packages(sandbox, site):
    """site-packages on a read-only filesystem (as a shared read-only NFS export would be)."""
    before = tree_digest(site)
    if not _mount_read_only(site):
        pytest.skip("this machine does not allow a read-only bind mount (needs root)")
    try:
        assert_refused(run_cli("apply", "--target", str(sandbox)), "cannot write", "Read-only file system")
        assert tree_digest(site) == before
    finally:
        subprocess.run(["umount", str(site)], check=True)


def test_not_a_python_interpreter(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Welcome to the cluster'\nexec cat >/dev/null\n")
    fake.chmod(0o755)
    assert_refused(run_cli("status", "--target", str(fake)), "did not answer as a Python interpreter")
    assert_refused(run_cli("status", "--target", "/bin/true"), "not a Python interpreter")  # nothing sent to it


def test_stale_virtual_env(tmp_path):
    assert_refused(run_cli("status", env={"VIRTUAL_ENV": str(tmp_path / "gone")}), "$VIRTUAL_ENV", "--target")


def test_hosts_file_missing_or_empty_never_falls_back_to_local(sandbox, site, tmp_path):
    before = tree_digest(site)
    empty = tmp_path / "hosts"
    empty.write_text("# no hosts yet\n\n")
    local = {"VIRTUAL_ENV": str(sandbox)}
    assert_refused(run_cli("apply", "--hosts-file", str(empty), env=local), "no hosts in")
    assert_refused(run_cli("apply", "--hosts-file", str(tmp_path / "nope"), env=local), "cannot read hosts file")
    assert tree_digest(site) == before


def test_revert_after_upgrading_speculators_does_not_restore_old_files(sandbox, site):

    from sandbox import pip_install

    run_cli("apply", "--target", str(sandbox))
    # pip acting on the sandbox's interpreter, as `pip install speculators==0.4.0` there would
    pip_install(sandbox, "speculators", "0.4.0")
    before = tree_digest(site)
    for force in ((), ("--force",)):
        assert_refused(run_cli("revert", "--target", str(sandbox), *force), "pip replaced speculators 0.3.0 by 0.4.0")
    assert tree_digest(site) == before


def test_syntax_error_names_the_right_line(sandbox, site):
    path = site / GENERATOR
    lines = path.read_text().splitlines(True)
    lines.insert(20, "def broken(:\n")
    path.write_text("".join(lines))
    assert_refused(run_cli("apply", "--target", str(sandbox)), f"{GENERATOR}:21:")


def test_target_given_twice_is_refused(sandbox, tmp_path):
    """The last --target used to win silently: a typo'd fleet script would patch the wrong env."""
    other = tmp_path / "other"
    other.mkdir()
    assert_refused(run_cli("status", "--target", str(sandbox), "--target", str(other)), "--target", "given 2 times")


def test_skipping_a_required_patch_is_refused_naming_both(sandbox, site):
    before = tree_digest(site)
    assert_refused(run_cli("apply", "--target", str(sandbox), "--skip", "SP010"), "requires SP010")
    assert tree_digest(site) == before


def test_a_refused_command_line_answers_in_json_where_json_was_asked(tmp_path):
    """A script that passes --json reads the refusal from stdout, as every other error."""
    import json

    result = run_cli("status", "--json", "--target", str(tmp_path), "--target", str(tmp_path / "b"))
    assert result.returncode == 2 and result.stderr == "", result.stderr
    answer = json.loads(result.stdout)
    assert answer["exit_code"] == 2 and "given 2 times" in answer["error"]


def test_list_answers_a_bad_patch_file_in_json(tmp_path):
    result = run_cli("list", "--json", "--patch-file", "/etc/passwd")
    assert result.returncode == 2 and result.stderr == ""
    assert "patch file /etc/passwd:1: syntax error" in __import__("json").loads(result.stdout)["error"]


def test_a_broken_interpreter_link_is_named_not_called_missing(tmp_path):
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "bin" / "python").symlink_to(tmp_path / "gone" / "python3")
    assert_refused(
        run_cli("status", "--target", str(tmp_path / "env")),
        f"{tmp_path / 'env' / 'bin' / 'python'} is a link that cannot be followed",
    )

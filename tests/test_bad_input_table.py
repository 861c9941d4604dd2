"""The bad-input table: every kind gives exit 2, one ``error:`` line, no traceback, and not
one byte of the target changed. Kinds that never reach a target run in-process (click's
runner); kinds that damage the target or its state run the real CLI on one sandbox, each
damage undone before the next."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import GENERATOR, ROOT, run_cli, tree_digest

COMMANDS = ("apply", "diff", "status", "verify", "revert")


def _assert_refused(code: int, stderr: str, stdout: str, kind: str) -> None:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert code == 2, (kind, code, stdout, stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), (kind, stderr)
    assert "Traceback" not in stderr + stdout, (kind, stderr)


def _option_kinds(tmp: Path) -> list[tuple[str, list[str]]]:
    (tmp / "notenv").mkdir(exist_ok=True)
    (tmp / "empty-hosts").write_text("# none\n")
    (tmp / "binary-hosts").write_bytes(bytes(range(256)) * 4)
    (tmp / "nul-hosts").write_bytes(b"host1\0host2\n")
    (tmp / "one-bad-host").write_text("node1\nbad host;x\n")
    (tmp / "ssh_config").write_text("Host x\n")
    (tmp / "plain.txt").write_text("hello")
    kinds = []
    for cmd in COMMANDS:
        kinds += [
            (f"{cmd}: unknown option", [cmd, "--bogus"]),
            (f"{cmd}: --jobs 0", [cmd, "--jobs", "0"]),
            (f"{cmd}: --jobs 999", [cmd, "--jobs", "999"]),
            (f"{cmd}: --jobs not a number", [cmd, "--jobs", "many"]),
            (f"{cmd}: --only unknown id", [cmd, "--only", "SP999"]),
            (f"{cmd}: --skip unknown name", [cmd, "--skip", "no-such-patch"]),
            (f"{cmd}: --only X --skip X", [cmd, "--only", "SP004", "--skip", "SP004"]),
            (f"{cmd}: --target empty", [cmd, "--target", ""]),
            (f"{cmd}: --target blank", [cmd, "--target", "   "]),
            (f"{cmd}: --target with a newline", [cmd, "--target", str(tmp / "a\nb")]),
            (f"{cmd}: --target missing", [cmd, "--target", str(tmp / "nope")]),
            (f"{cmd}: --target /bin/bash", [cmd, "--target", "/bin/bash"]),
            (f"{cmd}: --target a text file", [cmd, "--target", str(tmp / "plain.txt")]),
            (f"{cmd}: --target a plain directory", [cmd, "--target", str(tmp / "notenv")]),
            (f"{cmd}: --ssh-config without --host", [cmd, "--ssh-config", str(tmp / "ssh_config")]),
            (
                f"{cmd}: --ssh-config with only --exec",
                [cmd, "--ssh-config", str(tmp / "ssh_config"), "--exec", f"{sys.executable} -I"],
            ),
            (f"{cmd}: --ssh-persist negative", [cmd, "--host", "x", "--ssh-persist", "-1"]),
            (f"{cmd}: --ssh-persist without --host", [cmd, "--ssh-persist", "30"]),
            (f"{cmd}: --hosts-file missing", [cmd, "--hosts-file", str(tmp / "nope")]),
            (f"{cmd}: --hosts-file empty", [cmd, "--hosts-file", str(tmp / "empty-hosts")]),
            (f"{cmd}: --hosts-file binary", [cmd, "--hosts-file", str(tmp / "binary-hosts")]),
            (f"{cmd}: --hosts-file with NUL", [cmd, "--hosts-file", str(tmp / "nul-hosts")]),
            # One bad name among good ones: refused before any host is contacted.
            (f"{cmd}: a bad --host among good ones", [cmd, "--host", "node1", "--host", "bad;x"]),
            (f"{cmd}: a bad line in --hosts-file", [cmd, "--hosts-file", str(tmp / "one-bad-host")]),
        ]
    kinds += [
        ("unknown command", ["frobnicate"]),
        ("list: unknown option", ["list", "--bogus"]),
        ("repair: unknown option", ["repair", "--only", "SP004"]),
        ("repair: --target missing", ["repair", "--target", str(tmp / "nope")]),
        ("repair: --target /bin/bash", ["repair", "--target", "/bin/bash"]),
        ("revert: --force with a value", ["revert", "--force=yes"]),
        ("apply: --dry-run with a value", ["apply", "--dry-run=1"]),
        ("apply: --adopt with a value", ["apply", "--adopt=1"]),
        ("--jobs without a value", ["apply", "--jobs"]),
        ("--target without a value", ["status", "--target"]),
    ]
    return kinds


def test_option_kinds(tmp_path, sandbox, site, monkeypatch):
    from patcher.cli import main

    monkeypatch.setenv("VIRTUAL_ENV", str(sandbox))  # a bad option must never fall back to it
    before = tree_digest(site)
    runner = CliRunner()
    kinds = _option_kinds(tmp_path)
    for kind, argv in kinds:
        result = runner.invoke(main, argv)
        assert result.exception is None or isinstance(result.exception, SystemExit), (kind, result.exc_info)
        _assert_refused(result.exit_code, result.stderr, result.stdout, kind)
    assert tree_digest(site) == before


# --- Kinds that damage the target or its state --------------------------------------------


def _state(site: Path) -> Path:
    return site / ".speculators-patch"


def _manifest(site: Path) -> dict:
    return json.loads((_state(site) / "manifest.json").read_text())


def _set_manifest(site: Path, value) -> None:
    (_state(site) / "manifest.json").write_text(value if isinstance(value, str) else json.dumps(value))


def _backup(site: Path, path: str) -> Path:
    return next((_state(site) / "pristine").glob(path + ".sha256-*"))


def _vllm_file(site: Path) -> Path:
    return site / "vllm" / "v1" / "worker" / "gpu_worker.py"


def _entry_edit(key, value):
    def damage(site):
        m = _manifest(site)
        entry = m["files"][GENERATOR]
        if value is None:
            del entry[key]
        else:
            entry[key] = value
        _set_manifest(site, m)

    return damage


def _rename_entry(new):
    def damage(site):
        m = _manifest(site)
        m["files"][new] = m["files"].pop(GENERATOR)
        _set_manifest(site, m)

    return damage


def _journal(content: str):
    def damage(site):
        (_state(site) / "journal.json").write_text(content)

    return damage


def _journal_escape(site):
    digest = "0" * 64
    (_state(site) / "journal.json").write_text(
        json.dumps(
            {
                "root": str(site),
                "files": {"../../../../../../X": {"old": digest, "new": digest}},
                "manifest_old": None,
                "manifest_new": None,
                "new_backups": [],
                "drop": [],
            }
        )
    )


def _append(path_of, data: bytes):
    def damage(site):
        p = path_of(site)
        p.write_bytes(p.read_bytes() + data)

    return damage


def _truncate(path_of, keep: int = 0):
    def damage(site):
        p = path_of(site)
        p.write_bytes(p.read_bytes()[:keep])

    return damage


def _delete(path_of):
    def damage(site):
        path_of(site).unlink()

    return damage


def _write(path_of, data: bytes):
    def damage(site):
        path_of(site).write_bytes(data)

    return damage


def _no_version(site):
    meta = next(site.glob("speculators-*.dist-info")) / "METADATA"
    meta.write_text("".join(line + "\n" for line in meta.read_text().splitlines() if not line.startswith("Version:")))


def _zipped(site):
    import zipfile

    with zipfile.ZipFile(site / "speculators.zip", "w") as z:
        for p in (site / "speculators").rglob("*.py"):
            z.write(p, p.relative_to(site))
    shutil.rmtree(site / "speculators")
    (site / "zz.pth").write_text(str(site / "speculators.zip") + "\n")


GEN = lambda site: site / GENERATOR  # noqa: E731
MANIFEST = lambda site: _state(site) / "manifest.json"  # noqa: E731

# (kind, applied first?, damage, commands that must refuse it)
DAMAGE = [
    ("random bytes in a speculators file", False, _write(GEN, bytes(range(256)) * 64), ("apply", "diff", "status")),
    ("NUL byte in a speculators file", False, _append(GEN, b"\0\n"), ("apply", "diff")),
    ("undecodable UTF-8 in a speculators file", False, _append(GEN, b"# \xff\xfe\n"), ("apply", "diff")),
    (
        "unknown coding cookie",
        False,
        lambda s: GEN(s).write_bytes(b"# -*- coding: klingon -*-\n" + GEN(s).read_bytes()),
        ("apply", "diff"),
    ),
    ("syntax error in a vLLM file", False, _append(_vllm_file, b"\ndef broken(:\n"), ("apply", "diff", "status")),
    ("NUL byte in a vLLM file", False, _append(_vllm_file, b"\0"), ("apply", "status")),
    ("METADATA without a version", False, _no_version, ("apply", "status")),
    ("speculators in a zip", False, _zipped, ("apply", "status")),
    ("manifest deleted while patched", True, _delete(MANIFEST), ("status", "revert", "apply")),
    ("manifest is {}", True, lambda s: _set_manifest(s, {}), ("status", "revert")),
    ("manifest truncated", True, _truncate(MANIFEST, 40), ("status", "revert", "apply")),
    ("manifest not JSON", True, lambda s: _set_manifest(s, "not json"), ("status", "revert")),
    ("manifest a list", True, lambda s: _set_manifest(s, "[1, 2]"), ("status",)),
    ("manifest binary", True, _write(MANIFEST, bytes(range(256))), ("status",)),
    ("manifest entry without patched_sha256", True, _entry_edit("patched_sha256", None), ("status", "revert", "apply")),
    ("manifest entry with a short digest", True, _entry_edit("pristine_sha256", "abc"), ("status", "revert")),
    ("manifest entry patches not a dict", True, _entry_edit("patches", ["SP001"]), ("status",)),
    ("manifest entry ../ path", True, _rename_entry("../../../../etc/passwd.py"), ("status", "revert")),
    ("manifest entry absolute path", True, _rename_entry("/etc/passwd.py"), ("status",)),
    ("journal truncated", True, _journal('{"root": "'), ("status", "apply", "revert")),
    ("journal not a journal", True, _journal("[]"), ("status",)),
    ("journal with a ../ key", True, _journal_escape, ("status", "revert")),
    (
        "backup with a line appended",
        True,
        _append(lambda s: _backup(s, GENERATOR), b"import os\n"),
        ("revert", "status"),
    ),
    ("backup truncated", True, _truncate(lambda s: _backup(s, GENERATOR)), ("revert", "status")),
    (
        "backup replaced by garbage, revert --only",
        True,
        _write(lambda s: _backup(s, GENERATOR), b"\x00garbage"),
        ("revert --only SP004",),
    ),
    ("backup deleted", True, _delete(lambda s: _backup(s, GENERATOR)), ("revert", "apply")),
    # Updated upstream after patching (the pristine file plus a line, as `git pull` in an
    # editable install): apply would have to rewrite a modified file, so it refuses
    # (naming --adopt) and diff previews that refusal. (A comment appended to the patched
    # file is `modified` too, but then nothing needs rewriting: both say there is nothing to do.)
    (
        "file updated upstream after patching (diff previews apply's refusal)",
        True,
        lambda s: GEN(s).write_bytes(_backup(s, GENERATOR).read_bytes() + b"\nUPSTREAM_ADDED = 1\n"),
        ("diff", "apply"),
    ),
]


def test_damage_kinds(sandbox, site, tmp_path):
    saved = tmp_path / "saved"
    tried = 0
    for applied in (False, True):
        if applied:
            assert run_cli("apply", "--target", str(sandbox)).returncode == 0
        if saved.exists():
            shutil.rmtree(saved)
        shutil.copytree(site, saved, symlinks=True)
        for kind, needs_applied, damage, commands in DAMAGE:
            if needs_applied != applied:
                continue
            damage(site)
            before = tree_digest(site)
            for command in commands:
                result = run_cli(*command.split(), "--target", str(sandbox))
                _assert_refused(result.returncode, result.stderr, result.stdout, f"{kind} ({command})")
                assert tree_digest(site) == before, f"{kind} ({command}) changed the target"
                tried += 1
            shutil.rmtree(site)
            shutil.copytree(saved, site, symlinks=True)
    print(f"damage kinds: {len(DAMAGE)}, command runs: {tried}")


def test_stdout_closed_is_refused_before_anything(sandbox, site):
    before = tree_digest(site)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        f"'{sys.executable}' -m patcher apply --target '{sandbox}' >&-",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
    )
    _assert_refused(done.returncode, done.stderr, "", "stdout closed")
    assert tree_digest(site) == before


def _python_for_nobody() -> str:
    """An interpreter of this Python's version that an unprivileged user can start (this
    one may live under /root), with this environment's packages on its path."""
    import shutil

    for python in (
        sys.executable,
        shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}", path="/usr/local/bin:/usr/bin:/bin"),
    ):
        if (
            python
            and subprocess.run(
                [
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "sh",
                    "-c",
                    f'test -x "$(readlink -f {python})"',
                ],
                capture_output=True,
            ).returncode
            == 0
        ):
            return python
    pytest.skip("no interpreter of this Python's version that an unprivileged user can start")


def test_unreadable_target_directory(sandbox, site, tmp_path):
    """A target directory the user cannot traverse (a non-root user): refused in one line
    by the bootstrap, which resolves every target."""
    import sysconfig

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o755)
    packages = sysconfig.get_paths()["purelib"]  # with its .pth files: the editable install's finder
    done = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            _python_for_nobody(),
            "-I",
            "-c",
            f"import site, sys; site.addsitedir({packages!r}); sys.path.insert(0, {str(ROOT)!r}); "
            f"sys.argv=['speculators-patch', 'status', "
            f"'--target', {str(locked / 'env')!r}]; from patcher.cli import main; main()",
        ],
        capture_output=True,
        text=True,
    )
    _assert_refused(done.returncode, done.stderr, done.stdout, "untraversable target")
    assert f"cannot read target {locked / 'env'}: Permission denied" in done.stderr


def test_at_least_100_kinds(tmp_path):
    """The figure for the closing note: the kinds the tests above each try and assert refused
    (the option table, the damage table, closed stdout, an unreadable target). Counted from
    the tables, so it holds whichever worker runs which test (pytest-xdist)."""
    kinds = len(_option_kinds(tmp_path)) + len(DAMAGE) + 2
    print(f"bad-input kinds handled: {kinds}")
    assert kinds >= 100

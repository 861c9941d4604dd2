"""``speculators-patch new``: a patch file and its tests that work as written; the patch
refuses the real generator until it is filled in, then applies like FIX001."""

from __future__ import annotations

import subprocess
import sys

from support import GENERATOR, run_cli, tree_digest
from userfix import FIX001


def test_new_writes_a_patch_and_tests_that_pass_as_written(tmp_path):
    out = tmp_path / "fixes" / "fix001.py"
    result = run_cli("new", "FIX001", "--file", GENERATOR, "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {out} and {out.with_name('test_fix001.py')}")
    source = out.read_text()
    for words in (
        "self.already_satisfied(",
        "self.refuse(",
        'id="FIX001"',
        f'file="{GENERATOR}"',
        "from patcher import Patch",
    ):
        assert words in source
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out.with_name("test_fix001.py"))],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert tests.returncode == 0 and "3 passed" in tests.stdout, tests.stdout
    # FIX001 in the other tests is this template with three constants and a title filled in.
    assert sum(a != b for a, b in zip(source.splitlines(), FIX001.splitlines(), strict=False)) == 5


def test_the_unfilled_template_refuses_the_real_generator_in_one_line(tmp_path, sandbox, site):
    out = tmp_path / "fix001.py"
    assert run_cli("new", "FIX001", "--file", GENERATOR, "-o", str(out)).returncode == 0
    before = tree_digest(site)
    result = run_cli("apply", "--target", str(sandbox), "--patch-file", str(out))
    assert result.returncode == 2 and result.stderr == (
        f"error: {GENERATOR}: unrecognised code, expected one module-level assignment CHANGE_ME = 0 "
        "(FIX001 fix001; --skip FIX001 leaves it out)\n"
    )
    assert tree_digest(site) == before


def test_new_refuses_a_reserved_id_a_bad_file_and_overwriting(tmp_path):
    for args, says in (
        (("SP100", "--file", GENERATOR), "error: patch id 'SP100': letters then digits, not starting with SP"),
        (("FIX001", "--file", "vllm/x.py"), "error: --file 'vllm/x.py': the speculators file to patch"),
    ):
        result = run_cli("new", *args, "-o", str(tmp_path / "x.py"))
        assert result.returncode == 2 and result.stderr.startswith(says), result.stderr
    out = tmp_path / "fix002.py"
    out.write_text("mine\n")
    result = run_cli("new", "FIX002", "--file", GENERATOR, "-o", str(out))
    assert result.returncode == 2 and "exists" in result.stderr and out.read_text() == "mine\n"
    assert run_cli("new", "FIX002", "--file", GENERATOR, "-o", str(out), "--force").returncode == 0

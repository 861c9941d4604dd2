"""Patch packs: a tiny package pip-installed into a temporary environment with the tool
(entry-point group ``speculators_patch.patches``) is listed with its origin and applied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support import GENERATOR, tree_digest
from userfix import FIX001, FIX001_LINE

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "1.0"

[project.entry-points."speculators_patch.patches"]
fix001 = "{package}.fix001"
"""


def install_pack(tmp_path, name: str, module_source: str):
    """A venv holding only the pack ``name`` (pip-installed from source); returns a function
    running the real CLI under that venv's Python, the tool and its dependencies on the path."""
    package = name.replace("-", "_")
    src = tmp_path / f"{name}-src"
    (src / package).mkdir(parents=True)
    (src / "pyproject.toml").write_text(PYPROJECT.format(name=name, package=package))
    (src / package / "__init__.py").write_text("")
    (src / package / "fix001.py").write_text(module_source)
    venv = tmp_path / f"{name}-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            site,
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    if pip.returncode != 0:
        pytest.skip(f"cannot build a package here: {pip.stderr.strip().splitlines()[-1:]}")
    # The tool and its dependencies: this test run's environment, its .pth files included.
    (Path(site) / "with-the-tool.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(venv / "bin" / "python"), "-m", "patcher", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )

    return cli


def test_an_installed_pack_is_listed_with_its_origin_and_applied(tmp_path, sandbox, site):
    cli = install_pack(tmp_path, "fixpack", FIX001)
    listed = {p["id"]: p for p in json.loads(cli("list", "--json").stdout)}
    assert (listed["FIX001"]["origin"], listed["FIX001"]["source"]) == ("package", "fixpack 1.0")
    assert listed["SP004"]["origin"] == "shipped"
    text = cli("list").stdout
    assert "origin" in text and "package fixpack 1.0" in text

    result = cli("apply", "--target", str(sandbox), "--json")
    assert result.returncode == 0, result.stderr
    row = next(p for p in json.loads(result.stdout)["patches"] if p["id"] == "FIX001")
    assert (row["state"], row["origin"], row["source"]) == ("applied-now", "package", "fixpack 1.0")
    assert FIX001_LINE in (site / GENERATOR).read_text()
    manifest = json.loads((site / ".speculators-patch" / "manifest.json").read_text())
    assert manifest["user_patches"]["FIX001"]["origin"] == "package"
    after = tree_digest(site)
    assert json.loads(cli("apply", "--target", str(sandbox), "--json").stdout)["written"] == []
    assert tree_digest(site) == after
    # The tool without the pack still names it and can take it out.
    from support import run_cli, run_json

    code, status = run_json("status", "--target", str(sandbox))
    row = next(p for p in status["patches"] if p["id"] == "FIX001")
    assert (row["origin"], row["source"], row["loaded"]) == ("package", "fixpack 1.0", False)
    assert run_cli("revert", "--target", str(sandbox), "--only", "FIX001").returncode == 0
    assert FIX001_LINE not in (site / GENERATOR).read_text()


def test_a_broken_pack_is_one_error_line(tmp_path, sandbox, site):
    cli = install_pack(tmp_path, "brokenpack", FIX001.replace('id="FIX001"', 'id="SP999"'))
    before = tree_digest(site)
    for args in (("list",), ("apply", "--target", str(sandbox))):
        result = cli(*args)
        assert result.returncode == 2 and result.stdout == "", result.stderr
        assert result.stderr == (
            "error: package brokenpack (entry point fix001 = brokenpack.fix001): id SP999 uses the "
            "prefix SP, reserved for shipped patches (use e.g. FIX001)\n"
        )
    assert tree_digest(site) == before

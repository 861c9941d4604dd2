"""``pip install .`` ships every package under ``patcher/`` (an explicit list in pyproject.toml
missed patcher.selftest: a non-editable install could not run ``selftest``)."""

from __future__ import annotations

import pytest

from support import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_every_patcher_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "patcher").rglob("__init__.py")}
    assert on_disk - listed == set()

"""``pip install .`` ships every package under ``patcher/`` (an explicit list in pyproject.toml
missed patcher.selftest: a non-editable install could not run ``selftest``)."""

from __future__ import annotations

import pytest
from support import ROOT

pytestmark = pytest.mark.fast

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_every_patcher_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "patcher").rglob("__init__.py")}
    assert on_disk - listed == set()


def test_every_listed_package_exists():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "patcher").rglob("__init__.py")}
    assert {p for p in listed if p.startswith("patcher")} - on_disk == set()


def test_the_agent_program_ships_every_agent_module():
    """A module added to ``patcher/agent/`` is either part of the agent (in the order the
    loader runs them) or named as something else that runs there (``NOT_AGENT``)."""
    from patcher.connect.program import AGENT, AGENT_MODULES, NOT_AGENT

    assert sorted(p.stem for p in AGENT.glob("*.py")) == sorted(AGENT_MODULES + NOT_AGENT)

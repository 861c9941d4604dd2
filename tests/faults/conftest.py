"""Fault-injection tier: real requests captured once per session from a real sandbox."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from faultkit import capture  # noqa: E402
from support import FIGURES  # noqa: E402


@pytest.fixture(scope="session")
def reqs(tmp_path_factory):
    from sandbox import make_sandbox

    return capture(make_sandbox(tmp_path_factory.mktemp("faults") / "env"))


@pytest.fixture(scope="session")
def user_reqs(tmp_path_factory):
    """The same, for a commit that also carries FIX002, a user patch on a file no shipped
    patch touches (speculators/data_generation/logging_utils.py)."""
    from sandbox import make_sandbox
    from userfix import write_fix002

    top = tmp_path_factory.mktemp("faults-user")
    return capture(make_sandbox(top / "env"), (write_fix002(top),))


@pytest.fixture(scope="session")
def figures():
    return FIGURES

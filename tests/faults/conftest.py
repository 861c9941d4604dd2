"""Fault-injection tier: real requests captured once per session from a real sandbox."""

from __future__ import annotations

import pytest
from faultkit import capture
from support import FIGURES


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

"""Fixtures for the Ansible tier: the collection built and installed once per session, and
the loopback fleet of ``tests/ssh`` (eight sshd servers, each its own ``$HOME``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ssh"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleetplay import install_collection  # noqa: E402
from sshfixtures import *  # noqa: E402,F401,F403  (keys, fleet, fleet_envs, ...)


@pytest.fixture(scope="session")
def collections(tmp_path_factory) -> Path:
    """``ansible-galaxy collection build`` + ``install`` of ansible/speculators/patch."""
    return install_collection(tmp_path_factory.mktemp("collection"))

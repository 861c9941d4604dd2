"""Fixtures for the Ansible tier: the collection built and installed once per session, and
the loopback fleet of ``tests/ssh`` (eight sshd servers, each its own ``$HOME``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetplay import install_collection


@pytest.fixture(scope="session")
def collections(tmp_path_factory) -> Path:
    """``ansible-galaxy collection build`` + ``install`` of ansible/speculators/patch."""
    return install_collection(tmp_path_factory.mktemp("collection"))

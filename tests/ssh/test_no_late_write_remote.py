"""Issue 37 over SSH: a remote run that gave up on a held lock never writes afterwards, and a
Python 3.7 target there is refused in the words used locally and through ``--exec``, with
nothing written (the old interpreter is the stand-in of tests/test_odd_targets.py)."""

from __future__ import annotations

import sys
import time

import pytest
from sandbox import site_packages
from sshfixtures import remote
from support import digest, hold_lock, pretend_python, processes, release_lock

pytestmark = pytest.mark.ssh


def _install(site) -> dict[str, str]:
    top = [site / "speculators", site / ".speculators-patch"]
    return {str(p): digest(p) for t in top for p in sorted(t.rglob("*")) if p.is_file()}


def test_a_remote_revert_that_gave_up_on_the_lock_never_writes_later(sandbox, ssh_config):
    site = site_packages(sandbox)
    assert remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(sandbox)).returncode == 0
    before = _install(site)
    holder = hold_lock(site / ".speculators-patch" / "lock")
    try:
        result = remote(ssh_config, "revert", "--host", "gpu-box", "--target", str(sandbox), "--timeout", "2")
    finally:
        release_lock(holder)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert f"/.speculators-patch/lock is held by pid {holder.pid} (" in line, line
    assert line.endswith("gave up after 1 s waiting for it (--timeout); nothing changed"), line
    time.sleep(4)
    assert _install(site) == before
    assert not processes(f"{sandbox}/bin/python", "speculators-patch-agent-")


def test_a_remote_python_37_target_is_refused_with_nothing_written(sandbox, ssh_config):
    site = site_packages(sandbox)
    pretend_python(sandbox, "3.7")
    before = _install(site)
    real = sandbox / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    result = remote(ssh_config, "apply", "--host", "gpu-box", "--target", str(sandbox))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"error: the agent needs Python 3.8+: {real} is Python 3.7; nothing was read or changed"
    ), result.stderr
    assert _install(site) == before and not (site / ".speculators-patch").exists()

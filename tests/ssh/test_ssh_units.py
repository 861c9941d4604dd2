"""Pure functions of patcher.connect.ssh: host parsing, the constant remote command, the bootstrap,
and the wording of ssh failures (stderr texts as OpenSSH 9.2 prints them)."""

from __future__ import annotations

import ast
import shlex

import pytest

from patcher.connect.program import BOOTSTRAP
from patcher.connect.ssh import explain_ssh_failure, parse_host, remote_command, reuse_options
from patcher.errors import UserError

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    "spec, parsed",
    [
        pytest.param("gpu-box", (None, "gpu-box", None), id="alias"),
        pytest.param("root@10.0.0.5:2222", ("root", "10.0.0.5", 2222), id="user-address-port"),
        pytest.param("node1.cluster.example", (None, "node1.cluster.example", None), id="fqdn"),
        pytest.param("ml_user@node_7", ("ml_user", "node_7", None), id="underscores"),
        pytest.param("[::1]:22", (None, "::1", 22), id="ipv6-bracketed"),
        pytest.param("alice@[fe80::1]", ("alice", "fe80::1", None), id="ipv6-user"),
    ],
)
def test_parse_host(spec, parsed):
    assert parse_host(spec) == parsed


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param("-oProxyCommand=sh", id="option"),
        pytest.param("gpu-box;id", id="semicolon"),
        pytest.param("$(id)", id="substitution"),
        pytest.param("gpu box", id="space"),
        pytest.param("a@b@c", id="two-ats"),
        pytest.param("host:0", id="port-zero"),
        pytest.param("host:65536", id="port-too-big"),
        pytest.param("::1", id="ipv6-unbracketed"),
        pytest.param("", id="empty"),
    ],
)
def test_parse_host_refuses(spec):
    with pytest.raises(UserError, match="not a host"):
        parse_host(spec)


def test_remote_command_is_one_constant_with_no_user_data():
    argv = shlex.split(remote_command())
    assert argv[:2] == ["sh", "-c"] and len(argv) == 4
    assert remote_command() == remote_command()


def test_remote_command_survives_any_login_shell():
    """Single-quoted words without newlines, ``!`` or inner quotes: the same in sh, bash,
    zsh, fish and csh (which expands ``!`` even inside single quotes)."""
    for word in shlex.split(remote_command())[2:]:
        assert not set(word) & {"\n", "!", "'"}, word


def test_bootstrap_is_python_3_8_grammar():
    ast.parse(BOOTSTRAP, feature_version=(3, 8))


@pytest.mark.parametrize(
    "stderr, expected",
    [
        pytest.param("ssh: connect to host 127.0.0.1 port 2: Connection refused", "connection refused", id="refused"),
        pytest.param("root@127.0.0.1: Permission denied (publickey).", "authentication failed (publickey)", id="auth"),
        pytest.param(
            "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\n"
            "Host key verification failed.",
            "unknown host key",
            id="unknown-key",
        ),
        pytest.param(
            "@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\nHost key verification failed.",
            "host key CHANGED",
            id="changed-key",
        ),
        pytest.param("Connection timed out during banner exchange", "connection timed out", id="timeout"),
        pytest.param(
            "ssh: Could not resolve hostname nope: Name or service not known", "cannot resolve host name", id="dns"
        ),
        pytest.param("Connection closed by 127.0.0.1 port 2222", "connection dropped while committing", id="dropped"),
        pytest.param("Timeout, server 10.0.0.5 not responding.", "connection dropped while committing", id="keepalive"),
        pytest.param("", "the remote agent was killed while committing", id="killed-by-signal"),
        pytest.param(
            "kex_exchange_identification: something new",
            "ssh failed while committing: kex_exchange_identification",
            id="unknown-passes-through",
        ),
    ],
)
def test_explain_ssh_failure(stderr, expected):
    message = explain_ssh_failure(stderr, "gpu-box (root@10.0.0.5 port 22)", "while committing")
    assert message.startswith("gpu-box (root@10.0.0.5 port 22): ") and expected in message


def test_connection_reuse_options(monkeypatch):
    """A master per set of resolved options, in a 0700 directory; none where the user has
    a ControlPath, where persist is 0, or where the socket path would be too long."""
    import shutil
    import tempfile
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(prefix="sp-"))  # short: a unix socket path is at most 104 bytes
    monkeypatch.setenv("SPECULATORS_PATCH_CACHE", str(tmp_path / "c"))
    resolved = {"hostname": "10.0.0.5", "user": "root", "port": "22"}
    options = reuse_options(resolved, 60)
    assert options[:4] == ["-o", "ControlMaster=auto", "-o", "ControlPersist=60s"]
    assert options[5].startswith(f"ControlPath={tmp_path / 'c' / 'ssh'}/")
    assert (tmp_path / "c" / "ssh").stat().st_mode & 0o777 == 0o700
    other = reuse_options({**resolved, "setenv": "A=1"}, 60)
    assert other[5] != options[5]  # different settings: a different master
    assert reuse_options(dict(resolved), 60) == options  # same settings: the same one
    assert reuse_options({**resolved, "controlpath": "/home/me/.ssh/cm-%C"}, 60) == []
    assert reuse_options(resolved, 0) == []
    monkeypatch.setenv("SPECULATORS_PATCH_CACHE", str(tmp_path / ("x" * 60)))
    assert reuse_options(resolved, 60) == []
    shutil.rmtree(tmp_path)

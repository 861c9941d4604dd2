"""The agent on a remote machine, over one connection of the system OpenSSH client.

Nothing is installed remotely. ``ssh HOST <constant command>`` starts the remote user's
``python3`` on a tiny bootstrap (``patcher/agent/bootstrap.py``, base64 in the command line); the
bootstrap reads one length-prefixed header from stdin -- the ``--target`` path and the
agent's source -- decides on the remote side which interpreter runs the agent, and
``exec``s it. From then on the connection carries the same JSON lines as a local agent.

Quoting: the remote command line is the same constant string for every host and target
(``remote_command()``); the target path only ever travels as JSON data on stdin, and the
host name is one argv element after ``--``, validated first. Neither reaches a shell.

Why OpenSSH and not a Python SSH library: docs/ssh.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import subprocess

from patcher import cache
from patcher.connect.bootstrapped import BootstrapTransport, last_line
from patcher.connect.program import bootstrap_program
from patcher.errors import UserError
from patcher.ways import Way

# Seconds an idle shared connection stays open after a run (``--ssh-persist``); the
# default of Ansible's ssh connection plugin, for the same reason (docs/ssh.md).
DEFAULT_PERSIST = 60
# A unix socket path holds at most 104 bytes (macOS; 108 on Linux), and ssh first binds
# the master's socket as "<ControlPath>.<16 random characters>"; our socket names are 32.
_SOCKET_PATH_MAX = 104 - 1 - 32 - 17 - 1

# The remote command: POSIX sh finds python3 (else python) and runs the bootstrap. It is a
# constant: nothing from the user is in it. ``sh -c`` keeps it independent of the login shell.
# -S: the bootstrap needs no site-packages (it then ``exec``s the agent's interpreter).
_FIND_PYTHON = (
    'for p in python3 python; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -S -c "$0"; fi; done; '
    'echo "speculators-patch: no python3 on the remote PATH" >&2; exit 127'
)


def remote_command() -> str:
    """The one command line sent to every host (a constant string, shell-quoted once)."""
    return f"sh -c {shlex.quote(_FIND_PYTHON)} {shlex.quote(bootstrap_program())}"


_HOST = re.compile(
    r"(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_][A-Za-z0-9._-]*)"
    r"(?::(?P<port>[0-9]{1,5}))?"
)


def parse_host(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (or an ssh_config alias) -> (user, host, port).

    Raises ``UserError`` for anything else: no spaces, quotes, shell characters or a
    leading ``-`` can reach ssh's argv.
    """
    m = _HOST.fullmatch(spec)
    if not m or (m["port"] and not 0 < int(m["port"]) < 65536):
        raise UserError(f"not a host: {spec!r} (expected an ~/.ssh/config alias or [user@]host[:port])")
    return m["user"], m["host"].strip("[]"), int(m["port"]) if m["port"] else None


class Resolved(dict):
    """``ssh -G``'s options for a host: the first value of each key (as ssh uses it), and
    ``lines``, every ``(key, value)`` printed (``identityfile``, ``certificatefile``,
    ``setenv``... may appear several times)."""

    lines: list[tuple[str, str]]

    def __init__(self, lines: list[tuple[str, str]]) -> None:
        super().__init__()
        self.lines = lines
        for key, value in lines:
            self.setdefault(key, value)

    def values_of(self, key: str) -> list[str]:
        """Every value ``ssh -G`` printed for ``key``, in order ([] when none)."""
        return [v for k, v in self.lines if k == key]


def _resolved(base: list[str], host: str) -> Resolved:
    """``ssh -G``: the options ssh will use for ``host`` (reads config only; no connection)."""
    try:
        proc = subprocess.run([*base, "-G", "--", host], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise UserError(
            "no `ssh` client on this machine: install OpenSSH (e.g. apt-get install openssh-client)"
        ) from None
    if proc.returncode != 0:
        raise UserError(f"ssh cannot use host {host}: {last_line(proc.stderr) or 'ssh -G failed'}")
    return Resolved([(k, v) for k, _, v in (line.partition(" ") for line in proc.stdout.splitlines())])


def _expand(path: str, options: dict[str, str]) -> str:
    """A file option as ssh reads it: ``~`` and the tokens ssh_config allows in file names
    (``%d`` home, ``%u`` local user, ``%h`` host name, ``%p`` port, ``%r`` remote user,
    ``%n`` the name given, ``%l``/``%L`` local host, ``%i`` uid, ``%%``) and ``${VAR}``."""
    import getpass
    import socket

    home = os.path.expanduser("~")
    local = socket.gethostname()
    tokens = {
        "d": home,
        "u": getpass.getuser(),
        "h": options.get("hostname", ""),
        "p": options.get("port", ""),
        "r": options.get("user", ""),
        "n": options.get("host", ""),
        "l": local,
        "L": local.split(".")[0],
        "i": str(os.getuid()),
        "%": "%",
    }
    path = re.sub(r"%(.)", lambda m: tokens.get(m[1], m[0]), path)
    path = re.sub(r"\$\{(\w+)\}", lambda m: os.environ.get(m[1], ""), path)
    return os.path.expanduser(path)


def _file_fingerprint(path: str, content: bool) -> str:
    """What a trusted file is now: its sha256 (``content``) or its identity and age
    (device, inode, size, mtime: a private key is never read), or ``absent``."""
    try:
        if content:
            with open(path, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()
        st = os.stat(path)
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return "absent"


def trust_material(resolved: dict[str, str]) -> list | None:
    """Everything a connection to this host was trusted with, as it is now: the resolved
    options, the content of every known_hosts file ssh reads for it (user and global) and
    of ``RevokedHostKeys``, each identity and certificate file (identity and age, public
    halves by content), and the keys ssh-agent offers. A master is reused only while all
    of it is unchanged (``reuse_options``). None when it cannot be known without
    connecting: a ``KnownHostsCommand`` answers only when run for a key, so such hosts get
    no shared connection."""
    if resolved.get("knownhostscommand", "none").lower() != "none":
        return None
    lines = resolved.lines if isinstance(resolved, Resolved) else sorted(resolved.items())
    values = (
        resolved.values_of if isinstance(resolved, Resolved) else (lambda k: [resolved[k]] if k in resolved else [])
    )
    material: list = [lines]
    for key in ("userknownhostsfile", "globalknownhostsfile", "revokedhostkeys"):
        for value in values(key):
            for name in value.split():
                if name.lower() != "none":
                    path = _expand(name, resolved)
                    material.append([key, path, _file_fingerprint(path, content=True)])
    for key in ("identityfile", "certificatefile"):
        for value in values(key):
            path = _expand(value, resolved)
            material.append(
                [
                    key,
                    path,
                    _file_fingerprint(path, content=False),
                    _file_fingerprint(path + ".pub", content=True),
                    _file_fingerprint(path + "-cert.pub", content=True),
                ]
            )
    material.append(["agent", _agent_keys(resolved)])
    return material


def _agent_keys(resolved: dict[str, str]) -> str:
    """sha256 of the public keys ssh-agent offers for this host (``ssh-add -L``; a local
    question, a few ms), or why there are none: adding or removing a key in the agent is a
    change of identity too."""
    agent = resolved.get("identityagent", "SSH_AUTH_SOCK")
    if agent.lower() == "none":
        return "none"
    if agent == "SSH_AUTH_SOCK":
        sock = os.environ.get("SSH_AUTH_SOCK", "")
    elif agent.startswith("$"):
        sock = os.environ.get(agent[1:], "")
    else:
        sock = _expand(agent, resolved)
    if not sock:
        return "no agent"
    env = {**os.environ, "SSH_AUTH_SOCK": sock}
    try:
        listed = subprocess.run(["ssh-add", "-L"], capture_output=True, timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return "agent not asked"
    return f"{listed.returncode}:" + hashlib.sha256(listed.stdout).hexdigest()


def explain_ssh_failure(stderr: str, where: str, during: str, master_gone: bool = False) -> str:
    """One clear line for an ssh client failure (exit status 255), from its stderr.
    ``master_gone``: the session went through a shared connection (``reuse_options``)
    that no longer exists; such a session's ssh prints nothing when the link drops."""
    text = stderr
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        return (
            f"{where}: the host key CHANGED since it was recorded in known_hosts; refusing to connect. "
            f"If the machine was reinstalled, check the new fingerprint, then `ssh-keygen -R` the old key"
        )
    if "Host key verification failed" in text or "No ED25519 host key is known" in text or "host key is known" in text:
        return (
            f"{where}: unknown host key (not in known_hosts); host key checking stays on. "
            f"Check the fingerprint and add it, e.g. by running `ssh` to it once"
        )
    if "Permission denied" in text:
        methods = re.search(r"Permission denied \(([^)]*)\)", text)
        return (
            f"{where}: authentication failed ({methods[1] if methods else 'permission denied'}); "
            f"speculators-patch never prompts: load the key into ssh-agent or set IdentityFile"
        )
    if "Connection refused" in text:
        return f"{where}: connection refused (is sshd running, and is the port right?)"
    if "timed out" in text or "Connection timed out" in text:
        return f"{where}: connection timed out ({last_line(text)})"
    if "Could not resolve hostname" in text:
        return f"{where}: cannot resolve host name ({last_line(text)})"
    if (
        master_gone
        or "Timeout, server" in text
        or "Broken pipe" in text
        or "closed by" in text
        or "Connection reset" in text
    ):
        return (
            f"{where}: connection dropped {during}. A commit that had started finishes or rolls back "
            f"on the remote side by itself; run `{Way('status')}` on it to see which"
        )
    if not text.strip():  # ssh says nothing when the remote command dies of a signal
        return (
            f"{where}: the remote agent was killed {during}; the next speculators-patch command on that "
            f"host finishes a commit it had started past its commit point, or rolls it back"
        )
    return f"{where}: ssh failed {during}: {last_line(text)}"


def reuse_options(resolved: dict[str, str], persist: int) -> list[str]:
    """``-o`` options that share one SSH connection per host between runs: the first run
    opens a master connection (OpenSSH ``ControlMaster=auto``), later runs within
    ``persist`` seconds of the last one send their session through it and skip the key
    exchange and authentication (measured on loopback with OpenSSH 9.2: 0.2 s and 0.09 s
    of client CPU per connection, ~0.03 s and 0.02 s reused).

    A master serves only runs that trust exactly what it was opened with: the socket is
    named by the sha256 of ``trust_material`` -- the resolved options (``resolved``: ``ssh
    -G``'s output, every line), the known_hosts files' content, the identity files and the
    agent's keys -- so two aliases of one machine with different ``SetEnv``, user or key
    never share a connection (OpenSSH's own ``%C`` would let them: a session through a
    master gets the master's settings), and a host key replaced in known_hosts is checked
    by a new connection at once. The host's masters opened under other trust are stopped.

    Returns ``[]`` -- a connection of its own per run, as ssh does by default -- when
    ``persist`` is 0, when the host's ssh_config sets its own ``ControlPath`` (the user's
    multiplexing then applies unchanged; ``user_multiplexing`` also sees ``none``), when
    it uses a ``KnownHostsCommand``, or when the socket directory
    (``$SPECULATORS_PATCH_CACHE/ssh``, mode 0700) cannot be made private to this user or
    its path is too long for a unix socket.
    """
    if persist <= 0 or "controlpath" in resolved:
        return []
    folder = cache.base() / "ssh"
    if len(str(folder)) > _SOCKET_PATH_MAX:
        return []
    trust = trust_material(resolved)
    if trust is None:
        return []
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = folder.stat()
    except OSError:
        return []
    # Whoever can connect to a master socket can run commands on the host as this user.
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        return []
    # <host>-<trust>: a master serves only runs trusting exactly what it was opened with;
    # one of the same host opened under other trust is told to stop (``_retire``).
    host = hashlib.sha256(json.dumps([resolved.get(k) for k in ("host", "hostname", "user", "port")]).encode())
    name = f"{host.hexdigest()[:10]}-{hashlib.sha256(json.dumps(trust).encode()).hexdigest()[:21]}"
    _retire(folder, name)
    return ["-o", "ControlMaster=auto", "-o", f"ControlPersist={persist}s", "-o", f"ControlPath={folder}/{name}"]


def _retire(folder, name: str) -> None:
    """Stop every kept master of the same host whose trust differs from ``name``'s: a
    changed known_hosts entry, key, agent or option must not be ridden through a
    connection authenticated before the change. ``ssh -O stop`` (a local request to the
    master): it takes no new session and exits once those in flight have ended."""
    prefix = name.split("-", 1)[0] + "-"
    try:
        others = [p for p in folder.iterdir() if p.name.startswith(prefix) and p.name != name]
    except OSError:
        return
    for sock in others:
        try:
            if sock.is_socket():
                subprocess.run(
                    ["ssh", "-o", f"ControlPath={sock}", "-O", "stop", "retired"], capture_output=True, timeout=10
                )
        except (OSError, subprocess.TimeoutExpired):
            pass


_MARK = "speculators-patch-unset"


def user_multiplexing(base: list[str], config: str | None, host: str) -> bool:
    """True when the ssh_config that applies to ``host`` sets ``ControlPath`` or
    ``ControlMaster`` at all -- ``none``/``no`` included, which ``ssh -G`` cannot tell from
    unset. ``ssh -G`` reads a wrapper that includes the real files (``config``, else
    ``~/.ssh/config`` then ``/etc/ssh/ssh_config``, as ssh reads them) and sets both options
    last for every host; the first value obtained wins in ssh_config, so a value other than
    ours means the user set one. ``base``: the ssh argv before ``-G`` without ``-F``."""
    import tempfile

    files = [os.path.abspath(config)] if config else ["~/.ssh/config", "/etc/ssh/ssh_config"]
    wrapper = "".join(f'Include "{f}"\n' for f in files) + f"Host *\n  ControlPath /{_MARK}\n  ControlMaster autoask\n"
    with tempfile.NamedTemporaryFile("w", prefix="speculators-patch-", suffix=".ssh_config") as f:
        f.write(wrapper)
        f.flush()
        try:
            probe = subprocess.run(
                [base[0], "-F", f.name, *base[1:], "-G", "--", host], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return True  # cannot tell: leave the user's setup alone
    if probe.returncode != 0:
        return True
    seen = dict(line.partition(" ")[::2] for line in probe.stdout.splitlines())
    return seen.get("controlpath") != f"/{_MARK}" or seen.get("controlmaster") != "autoask"


class SshTransport(BootstrapTransport):
    """The agent on ``host`` over a single ``ssh`` process (one connection per subcommand).

    Args:
        host: an ssh_config alias or ``[user@]host[:port]``.
        target: the remote ``--target`` path, or None for the remote python3's environment.
        ssh_config: a config file to use instead of ~/.ssh/config (``ssh -F``).
        persist: seconds a shared connection outlives the run (``reuse_options``; 0: none).
    """

    tcp_connect_timeout = 15  # ssh's own ConnectTimeout (whole seconds); the handshake's is connect_timeout
    keepalive = (5, 3)  # ServerAliveInterval, ServerAliveCountMax: a dead peer is noticed in ~15 s

    def __init__(
        self, host: str, target: str | None, ssh_config: str | None = None, persist: int = DEFAULT_PERSIST
    ) -> None:
        self.user, self.hostname, self.port = parse_host(host)
        self.label = f"{host}:{target}" if target else host
        super().__init__(target)
        self.host = host
        self.ssh_config = ssh_config
        self.persist = persist
        self._control_path: str | None = None  # set by _argv when the connection is shared
        self._header_where = host

    def _base(self, with_config: bool = True) -> list[str]:
        argv = ["ssh"]
        if self.ssh_config and with_config:
            argv += ["-F", self.ssh_config]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.user:
            argv += ["-l", self.user]
        return argv

    def _argv(self) -> list[str]:
        opts = _resolved(self._base(), self.hostname)
        self._where = (
            f"{self.host} ({opts.get('user', '?')}@{opts.get('hostname', self.hostname)} port {opts.get('port', '?')})"
        )
        # -T: no tty (a clean byte pipe); BatchMode: never prompt (a password or host key
        # question would hang parallel runs; unknown keys fail with a message instead);
        # no forwarding or RemoteCommand from the config: this connection only runs the agent.
        argv = self._base() + ["-T", "-o", "BatchMode=yes", "-o", "ClearAllForwardings=yes"]
        if opts.get("remotecommand", "none") != "none":
            argv += ["-o", "RemoteCommand=none"]
        if opts.get("connecttimeout", "none") == "none":
            # ssh gives up on a host that does not answer before --connect-timeout does, so the
            # error is ssh's own "Connection timed out", not a silent far side
            tcp = max(1, min(self.tcp_connect_timeout, math.ceil(self.connect_timeout) - 1))
            argv += ["-o", f"ConnectTimeout={tcp}"]
        if opts.get("serveraliveinterval", "0") == "0":
            argv += ["-o", f"ServerAliveInterval={self.keepalive[0]}", "-o", f"ServerAliveCountMax={self.keepalive[1]}"]
        shared = reuse_options(opts, self.persist)
        if shared and user_multiplexing(self._base(with_config=False), self.ssh_config, self.hostname):
            shared = []  # the user's ControlMaster/ControlPath settings (even "no"/"none") apply
        self._control_path = shared[-1].split("=", 1)[1] if shared else None
        argv += shared
        return argv + ["--", self.hostname, remote_command()]

    def _failure(self, op: str) -> str:
        code = self._exit_code()
        stderr = self.stderr_text()
        during = "while committing" if op == "commit" else "while reading"
        if code == 255 or code < 0:
            return explain_ssh_failure(stderr, self._where, during, master_gone=self._master_gone())
        return f"{self._where}: remote agent ended (status {code}) {during}: {last_line(stderr) or 'no output'}"

    def _master_gone(self) -> bool:
        """True when this run's session went through a shared connection that has since
        closed (``ssh -O check``: a local question to the master, no network)."""
        if self._control_path is None:
            return False
        check = subprocess.run(
            ["ssh", "-o", f"ControlPath={self._control_path}", "-O", "check", "master"], capture_output=True, timeout=10
        )
        return check.returncode != 0

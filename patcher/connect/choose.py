"""Which transport reaches a target: ``--exec``, ``--host`` (SSH) or this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from patcher.connect.transport import Transport


def transport_for(
    target: str | None,
    host: str | None = None,
    ssh_config: str | None = None,
    persist: int | None = None,
    connect_timeout: float | None = None,
    timeout: float | None = None,
) -> Transport:
    """The transport to the agent for ``target`` (resolved where the agent runs).

    Args:
        target: ``--target``, or None for the active environment there.
        host: an SSH host (``[user@]host[:port]`` or an ssh_config alias), an ``--exec``
            command (``patcher.connect.exec.ExecTarget``), or None for this machine.
        ssh_config: ``--ssh-config FILE`` (SSH only).
        persist: ``--ssh-persist`` seconds (SSH only; None: ``connect.ssh.DEFAULT_PERSIST``).
        connect_timeout, timeout: ``--connect-timeout`` and ``--timeout`` in seconds (None:
            ``connect.transport``'s defaults).
    Raises ``UserError`` for a malformed host or ``--exec`` command; nothing is started
    until the transport is entered.
    """
    from patcher.connect.exec import ExecTarget

    if isinstance(host, ExecTarget):
        from patcher.connect.exec import ExecTransport

        transport: Transport = ExecTransport(host, target)
    elif host is not None:
        from patcher.connect.ssh import DEFAULT_PERSIST, SshTransport

        transport = SshTransport(host, target, ssh_config, DEFAULT_PERSIST if persist is None else persist)
    else:
        from patcher.connect.local import LocalTransport

        transport = LocalTransport(target)
    if connect_timeout is not None:
        transport.connect_timeout = float(connect_timeout)
    if timeout is not None:
        transport.timeout = float(timeout)
    return transport

"""Every check ``verify`` makes, as one list, in the order it reports them (``checks``), and
what they ask the target together (``ask``). What each one implements: ``patcher.checks.check``.
A new kind of check is one module with a ``CHECK`` and one line here."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from patcher.checks.check import Check
    from patcher.engine import Snapshot


def checks() -> tuple[Check, ...]:
    """Every check, in the order ``verify`` reports them (its JSON, its lines, ``failing``)."""
    from patcher.checks import lifecycle, parts

    return (
        parts.VERDICTS,
        parts.CALLS,
        lifecycle.CHECK,
        parts.IMPORTS,
        parts.RUNNER,
        parts.SOURCES,
        parts.VERSIONS,
        parts.MODIFIED,
        parts.EDITED,
        parts.PROOF,
    )


def ask(snap: Snapshot) -> dict:
    """Every check's fields of verify's ``sources`` request, joined in the list's order."""
    request: dict = {}
    for check in checks():
        for name, value in check.ask(snap).items():
            request[name] = request.get(name, []) + value if isinstance(value, list) else value
    return request

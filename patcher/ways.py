"""A way-out command as a value: ``Way(verb, flags)``, e.g. ``Way("repair")`` or
``Way("apply", ("--adopt",))``.

The layers below the front end write a way into their text as a token, ``str(way)``:
``⟦speculators-patch apply --adopt⟧``; the agent writes the same token with the standard
library alone (``patcher/agent/common.py``'s ``way``), so a way crosses the JSON pipe inside
the text it belongs to. The front end renders every token once, with its run's target
options (``render(text, said)``, ``said`` being the CLI's ``cli.options.Advice.say``, which
the Ansible plugins use too). A sequence is tokens in a row:
``f"{Way('revert')} && {Way('apply')}"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

PROGRAM = "speculators-patch"
OPEN, CLOSE = "\u27e6", "\u27e7"  # ⟦ ⟧: never in rich markup, JSON escapes or a file this tool reads

_TOKEN = re.compile(f"{OPEN}{PROGRAM} ([a-z-]+)((?: [^ {CLOSE}]+)*){CLOSE}")


@dataclass(frozen=True)
class Way:
    """``speculators-patch VERB FLAGS...``: what to run, without where (the front end adds it)."""

    verb: str
    flags: tuple[str, ...] = ()

    def __str__(self) -> str:
        """The token a lower layer writes into its text."""
        return f"{OPEN}{self.plain()}{CLOSE}"

    def plain(self) -> str:
        """The command as said to a run that named no target option."""
        return " ".join((PROGRAM, self.verb, *self.flags))


def render(text: str, said: Callable[[Way], str] = Way.plain) -> str:
    """``text`` with each way's token replaced by ``said(way)`` (by default the plain command)."""
    if OPEN not in text:
        return text
    return _TOKEN.sub(lambda m: said(Way(m[1], tuple(m[2].split()))), text)


def render_all(value: Any, said: Callable[[Way], str] = Way.plain) -> Any:
    """``value`` (JSON-like: dicts, lists, strings) with every string ``render``-ed."""
    if isinstance(value, str):
        return render(value, said)
    if isinstance(value, dict):
        return {k: render_all(v, said) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(render_all(v, said) for v in value)
    return value

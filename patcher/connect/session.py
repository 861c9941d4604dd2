"""One run on one target: the value the verbs, the engine and the checks share for its length.

A ``Session`` holds the transport, the requests queued to ride on the next exchange and their
answers, the cache locks the run holds until it ends, and the files its commits wrote. The
transport itself is only the pipe: nothing a layer leaves for another rides on it.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ContextManager

if TYPE_CHECKING:
    from patcher.connect.transport import Transport


def _key(message: dict) -> str:
    return json.dumps(message, sort_keys=True)


@dataclass
class Session:
    """``transport``: the agent's pipe (entered by the caller). ``queued``: requests the agent
    runs right after the next one succeeds, answered in the same line (``send_ahead``);
    ``answers``: theirs, until asked for (by JSON of the request); ``held``: context managers
    (cache locks) kept until ``release`` or the session's end; ``written``: the files this
    run's commits wrote (what an interruption says was already changed). Use as a context
    manager: its end releases what it holds."""

    transport: Transport
    queued: list[dict] = field(default_factory=list)
    answers: dict[str, dict] = field(default_factory=dict)
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    written: list[str] = field(default_factory=list)

    @staticmethod
    def of(transport: Transport | Session) -> ContextManager[Session]:
        """``transport``'s session: itself when it is one (its owner ends it), else a new
        session that ends with the ``with`` block (a caller that passed a bare transport)."""
        if isinstance(transport, Session):
            return contextlib.nullcontext(transport)
        return Session(transport)

    @property
    def label(self) -> str:
        """The target's label (``Transport.label``)."""
        return self.transport.label

    def send_ahead(self, op: str, **payload: object) -> None:
        """Have ``op`` ride on the next request; a later ``request(op, **payload)`` with the
        same payload gets its answer without an exchange (``apply``: verify's ``sources``
        rides on the commit)."""
        self.queued.append({"op": op, **payload})

    def request(self, op: str, **payload: object) -> dict:
        """One exchange (``Transport.request``), or the answer a queued request already got.
        Raises ``UserError`` as the agent's answer does."""
        from patcher.errors import UserError

        message = {"op": op, **payload}
        early = self.answers.pop(_key(message), None)
        if early is not None:
            if "error" in early:
                raise UserError(early["error"])
            return early["ok"]
        ahead, self.queued = [a for a in self.queued if _key(a) != _key(message)], []
        if not ahead:
            answer, then = self.transport.request(op, **payload), []
        else:
            answer, then = self.transport.request_then(op, ahead, **payload)
        for sent, got in zip(ahead, then, strict=False):  # an answer may carry fewer
            self.answers[_key(sent)] = got
        if op == "commit":
            self.written += answer.get("written") or []
        return answer

    def hold(self, lock: ContextManager) -> None:
        """Enter ``lock`` and keep it until ``release`` or the session's end."""
        self.held.enter_context(lock)

    def release(self) -> None:
        """Leave every lock held (hosts waiting on them go on)."""
        self.held.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()  # a lock another host waits on is never kept past this run

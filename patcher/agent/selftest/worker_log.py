"""The output of vLLM's processes while the generator runs, and the worker's own exception in it.

vLLM's worker processes inherit this process's stdout and stderr, and log there (stdout by
default, ``VLLM_LOGGING_STREAM``), each line prefixed ``(Worker pid=N)`` or similar. When a
worker dies at start the parent only raises ``WorkerProc initialization failed due to an
exception in a background process. See stack trace for root cause.``
(vllm/v1/executor/multiproc_executor.py, ``WorkerProc.wait_for_ready``); the cause is the
traceback the worker logged (``logger.exception("WorkerProc failed to start.")``).

``Captured`` sends file descriptors 1 and 2 to a file for the duration (children inherit
them); ``worker_exception`` finds the innermost exception a vLLM process logged there.
Standard library only.
"""

from __future__ import annotations

import os
import re
import sys

# "(Worker pid=123) ", "(Worker_TP1 pid=9) ", "(VllmWorker rank=0 pid=7) ", "(EngineCore_DP0 pid=5) "
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # vLLM colours the prefix on a terminal
PREFIX = re.compile(r"^\((?P<who>[^()]*?)\s*pid=(?P<pid>\d+)\)\s?")
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)$')
EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
CHAINED = ("The above exception was the direct cause", "During handling of the above exception")
# vLLM's formatter repeats a record's header on each line of a multi-line message:
# "ERROR 12-01 14:06:12 [multiproc_executor.py:783] Traceback (most recent call last):"
HEADER = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?")


class Captured:
    """``with Captured(path) as log:`` -- fds 1 and 2 go to ``path`` (appended) inside the
    block, and back afterwards; ``log.original_stderr`` is a writable file on the original
    stderr for progress lines; ``log.text()`` reads what was written."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.original_stderr = sys.stderr

    def __enter__(self) -> "Captured":
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        self.original_stderr = os.fdopen(os.dup(self._saved[1]), "w", buffering=1)
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self.original_stderr.close()
        self.original_stderr = sys.stderr

    def text(self) -> str:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def _by_process(text: str) -> dict[str, list[tuple[str, str]]]:
    """(record header, text) lines per writer: ``who pid=N`` for prefixed lines, ``""`` for
    this process's own; the header is ``""`` for lines not written through vLLM's logger."""
    lines: dict[str, list[tuple[str, str]]] = {}
    for raw in ANSI.sub("", text).splitlines():
        match = PREFIX.match(raw)
        key = f"{match['who']} pid={match['pid']}" if match else ""
        rest = raw[match.end() :] if match else raw
        header = HEADER.match(rest)
        lines.setdefault(key, []).append((header.group(0) if header else "", rest[header.end() :] if header else rest))
    return lines


def _tracebacks(lines: list[tuple[str, str]]) -> list[list[dict]]:
    """Each logged exception chain: its blocks in order (the first is the root cause), each
    ``{"type", "message", "frames": ["file:line in fn", ...]}``."""
    chains: list[list[dict]] = []
    chained = False
    i = 0
    while i < len(lines):
        if lines[i][1].strip() != "Traceback (most recent call last):":
            i += 1
            continue
        if not chained:
            chains.append([])
        chained = False
        frames, i = [], i + 1
        while i < len(lines) and (lines[i][1].startswith(" ") or not lines[i][1].strip()):
            frame = FRAME.match(lines[i][1])
            if frame:
                frames.append(f"{frame['file']}:{frame['line']} in {frame['fn']}")
            i += 1
        block = {"type": "", "message": "", "frames": frames}
        if i < len(lines):
            header, text = lines[i]
            exc = EXCEPTION.match(text.strip())
            if exc:
                block["type"], block["message"] = exc["type"], (exc["message"] or "").strip()
            i += 1
            extra = []  # a message of several lines: same record (header), or until a blank line
            while (
                i < len(lines)
                and lines[i][1].strip()
                and lines[i][1].strip() != "Traceback (most recent call last):"
                and not lines[i][1].startswith(CHAINED)
                and (lines[i][0] == header if header else not lines[i][0])
            ):
                extra.append(lines[i][1].rstrip())
                i += 1
            if extra:
                block["message"] = "\n".join([block["message"], *extra]).strip()
        while i < len(lines) and not lines[i][1].strip():
            i += 1
        if i < len(lines) and lines[i][1].startswith(CHAINED):
            chained = True
            i += 1
        chains[-1].append(block)
    return chains


def worker_exception(text: str, frames: int = 3) -> dict | None:
    """The innermost exception a vLLM process logged in ``text`` (worker processes first,
    then any other prefixed process, then this process's own lines): ``{"process", "type",
    "message", "frames": the innermost ``frames`` frames, "raised": the chain's last
    exception when it differs}``; None when nothing was logged."""
    per = _by_process(text)
    order = sorted(per, key=lambda k: (not k, "worker" not in k.lower(), k))
    for key in order:
        chains = [c for c in _tracebacks(per[key]) if c and c[0]["type"]]
        if not chains:
            continue
        chain = chains[0]  # the first failure this process logged; later ones follow from it
        root, last = chain[0], chain[-1]
        found = {
            "process": key or "vLLM's log",
            "type": root["type"],
            "message": root["message"],
            "frames": root["frames"][-frames:],
        }
        if last is not root:
            found["raised"] = f"{last['type']}: {last['message']}".strip()
        return found
    return None

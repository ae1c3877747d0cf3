#!/usr/bin/env bash
# One device call on the H200: build, GPU check (CUDA op tests + decodes), compute-sanitizer, benchmarks.
# Usage (from the repo root, on the GPU machine): bash benchmarks/h200_session.sh MODE; logs go to $OUT.
#   check: gpu-check, verify and the sanitizers      bench: the kernel and decode benchmarks
#   full: check + bench (over 10 minutes)            moe: the Kimi-K2-width MoE benchmark
#   target: train the shipped target (showcase preset, resumable) into $PAIR
#   drafter: train its DFlash drafter into $PAIR/dflash, then bench_pair; tars the pair into $OUT
set -uo pipefail
OUT=${OUT:-/tmp/ddtree-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DDTREE_BUILD_DIR=/tmp/ddtree-build
# The image's CXX (/opt/gcc/bin/g++, a wrapper) links libstdc++ statically and the library then crashes on
# its first error message; the loader's error-path probe says so. The system g++ links it dynamically.
export CXX=/usr/bin/g++
mode=${1:-check}
PAIR=${PAIR:-/tmp/pair/ddtree-py-7m}
CORPUS=${CORPUS:-.corpus/cpython-3.11-lib}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/env.txt"
if [ "$mode" = check ] || [ "$mode" = full ]; then
  ( time python3 -m engine gpu-check -- -q ) 2>&1 | tee "$OUT/gpu_check.log"
  ( time python3 -m engine verify --device cuda ) 2>&1 | tee -a "$OUT/gpu_check.log"
  timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
    tests/test_ops_cuda.py -k "tiny or odd or small-tree or prefill or accept or compact or special or nan or \
    (with_ties and 512) or threshold_build_orders_tied or positive" 2>&1 | tail -4 | tee "$OUT/memcheck.log"
  timeout 150 compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
    tests/test_ops_cuda.py -k "verify_attn and (tiny or prefill or causal-after) or tree_build_equals_cpu_op_on or \
    threshold_build_orders_tied" \
    2>&1 | tail -4 | tee "$OUT/racecheck.log"
fi
if [ "$mode" = bench ] || [ "$mode" = full ]; then
  timeout 300 python3 -m benchmarks.bench_kernels --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_kernels.log"
  timeout 240 python3 -m benchmarks.bench_decode --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_decode.log"
fi
if [ "$mode" = moe ]; then
  timeout 300 python3 -m benchmarks.bench_moe --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_moe.log"
fi
if [ "$mode" = target ]; then  # resumes a paused or interrupted run in $PAIR; builds the kernels meanwhile
  python3 -c "import kernels; kernels.load()" >"$OUT/build.log" 2>&1 &
  resume=(); compgen -G "$PAIR/checkpoints/step-*.pt" >/dev/null && resume=(--resume)
  [ -f "$PAIR/training.json" ] && [ -z "${resume[*]}" ] && echo "$PAIR holds a finished run" || \
  timeout "${TRAIN_S:-540}" python3 -m engine train-target --out "$PAIR" --preset showcase --corpus-dir "$CORPUS" \
    "${resume[@]}" 2>&1 | tr '\r' '\n' | tee -a "$OUT/train_target.log"
  wait
fi
if [ "$mode" = drafter ]; then
  resume=(); compgen -G "$PAIR/dflash/checkpoints/step-*.pt" >/dev/null && resume=(--resume)
  [ -f "$PAIR/dflash/training.json" ] && [ -z "${resume[*]}" ] && echo "$PAIR/dflash holds a finished run" || \
  timeout "${TRAIN_S:-480}" python3 -m engine train-drafter --target "$PAIR" --preset showcase \
    --corpus-dir "$CORPUS" "${resume[@]}" 2>&1 | tr '\r' '\n' | tee -a "$OUT/train_drafter.log"
  timeout 100 python3 -m benchmarks.bench_pair --model "$PAIR" --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_pair.log"
  tar -C "$(dirname "$PAIR")" --exclude=checkpoints -cf "$OUT/pair.tar" "$(basename "$PAIR")"
fi

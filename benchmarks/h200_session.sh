#!/usr/bin/env bash
# One device call on the H200: build, GPU check (CUDA op tests + decodes), compute-sanitizer, benchmarks.
# Usage (from the repo root, on the GPU machine): bash benchmarks/h200_session.sh [check|bench|full]; logs go
# to $OUT. check: gpu-check, verify and the sanitizers; bench: both benchmarks; full: both (over 10 minutes).
set -uo pipefail
OUT=${OUT:-/tmp/ddtree-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DDTREE_BUILD_DIR=/tmp/ddtree-build
# The image's CXX (/opt/gcc/bin/g++, a wrapper) links libstdc++ statically and the library then crashes on
# its first error message; the loader's error-path probe says so. The system g++ links it dynamically.
export CXX=/usr/bin/g++
mode=${1:-check}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/env.txt"
if [ "$mode" != bench ]; then
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
if [ "$mode" != check ]; then
  timeout 300 python3 -m benchmarks.bench_kernels --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_kernels.log"
  timeout 240 python3 -m benchmarks.bench_decode --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_decode.log"
fi

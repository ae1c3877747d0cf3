#!/usr/bin/env bash
# One device call on the H200: build, GPU check (CUDA op tests + decodes), compute-sanitizer, benchmarks.
# Usage (from the repo root, on the GPU machine): bash benchmarks/h200_session.sh MODE; logs go to $OUT.
#   check: gpu-check, verify and the sanitizers      bench: the kernel and decode benchmarks
#   full: check + bench (over 10 minutes)            moe: the Kimi-K2-width MoE benchmark
#   exact: the batch-invariant mode's matmul (bench_kernels --sections linear_rows) and steps (bench_exact)
#   router: router_logits' CUDA tiles beside cuBLAS's float32 gemm (benchmarks/router_tiles.cu, built with nvcc)
#   pair: train the shipped pair's way (the PRESET presets, default showcase-22m, on CORPUS, default the packed
#         .corpus/stdlib-torch-apps.tar.xz; resumable while the machine is held):
#         pretrain a target into $PAIR-pretrained, fine-tune it with the unlikelihood stage (UNLIKELIHOOD_ARGS; empty:
#         no stage, the pretrained target is $PAIR) into $PAIR, train its DFlash drafter, tar the furthest finished
#         stage into $OUT in parts, then bench_pair (--corpus-dir CORPUS, BENCH_ARGS) with what is left of TOTAL_S;
#         TARGET_ARGS and DRAFTER_ARGS add options, e.g. TARGET_ARGS="--steps 8000"
#   parallel: on a machine of several GPUs, bench_moe at a fixed model over 1, 2, 4, ... ranks (torchrun, NCCL),
#         then the parallel CPU tests; NVLink multicast stays off (the three variables below)
set -uo pipefail
OUT=${OUT:-/tmp/ddtree-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DDTREE_BUILD_DIR=/tmp/ddtree-build
# The image's CXX (/opt/gcc/bin/g++, a wrapper) links libstdc++ statically and the library then crashes on
# its first error message; the loader's error-path probe says so. The system g++ links it dynamically.
export CXX=/usr/bin/g++
mode=${1:-check}
PAIR=${PAIR:-/tmp/pair/ddtree-py-22m}
CORPUS=${CORPUS:-.corpus/stdlib-torch-apps.tar.xz}
PRESET=${PRESET:-showcase-22m}
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
  timeout 300 python3 -m benchmarks.bench_kernels --device cuda --out "$OUT" \
    --sections verify_attn,tree_build,tree_build_tiny,tree_accept,kv_compact 2>&1 | tee "$OUT/bench_kernels.log"
  timeout 240 python3 -m benchmarks.bench_decode --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_decode.log"
fi
if [ "$mode" = exact ]; then
  timeout 150 python3 -m benchmarks.bench_kernels --device cuda --sections linear_rows --out "$OUT/linear_rows" 2>&1 \
    | tee "$OUT/bench_linear_rows.log"
  timeout 120 python3 -m benchmarks.bench_exact --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_exact.log"
fi
if [ "$mode" = router ]; then
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a benchmarks/router_tiles.cu -lcublas -o /tmp/router_tiles \
    && /tmp/router_tiles 2>&1 | tee "$OUT/router_tiles.log"
fi
if [ "$mode" = moe ]; then
  timeout 300 python3 -m benchmarks.bench_moe --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_moe.log"
fi
if [ "$mode" = parallel ]; then
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  gpus=$(nvidia-smi -L | wc -l)
  for world in 1 2 4 8; do
    [ "$world" -le "$gpus" ] || break
    timeout 300 torchrun --standalone --nproc-per-node "$world" -m benchmarks.bench_moe --device cuda \
      --layers "${LAYERS:-4}" --out "$OUT" 2>&1 | tee "$OUT/bench_moe_w$world.log"
  done
  python3 -m pytest -q -p no:cacheprovider tests/test_parallel.py 2>&1 | tail -3 | tee "$OUT/parallel_tests.log"
fi
# The shipped pair, resumable: each stage continues a paused or interrupted run in its folder, or skips a finished one.
# The folders stay on the machine between calls while it is held (checkpoints hold optimizer state, too large to bring
# back). Every stage's output goes to $OUT/pair.log: a call brings back at most 8 files.
UNLIKELIHOOD_ARGS=${UNLIKELIHOOD_ARGS---steps 600 --lr 1e-4 --seed 1 --log-every 50 --eval-every 100 \
--checkpoint-every 100 --unlikelihood-weight 0.5 --unlikelihood-batch 64 --unlikelihood-every 5}
train() {  # train(label, dir, seconds, command...): skipped when under a minute is left
  local label=$1 dir=$2 seconds=$3; shift 3
  local resume=(); compgen -G "$dir/checkpoints/step-*.pt" >/dev/null && resume=(--resume)
  if [ -f "$dir/training.json" ] && [ -z "${resume[*]}" ]; then echo "$label: $dir holds a finished run"; return; fi
  if [ "$seconds" -lt 60 ]; then echo "$label: ${seconds} s left, not started (the next call resumes)"; return; fi
  echo "== $label, up to $seconds s: $* ${resume[*]}"
  timeout "$seconds" "$@" "${resume[@]}" 2>&1 | tr '\r' '\n'
}
if [ "$mode" = pair ]; then  # one call: the target's stages, the drafter (what time is left), the pair into $OUT, bench
  total=${TOTAL_S:-560}
  python3 -c "import kernels; kernels.load()" >"$OUT/build.log" 2>&1 &
  if [[ "$CORPUS" == *.tar.xz ]]; then  # a packed corpus (stage_corpus --with-torch): unpacked once per machine
    unpacked=/tmp/corpus/$(basename "$CORPUS" .tar.xz)
    [ -d "$unpacked" ] || { mkdir -p "$unpacked" && tar -xJf "$CORPUS" -C "$unpacked"; }
    CORPUS=$unpacked
  fi
  pretrained=$PAIR; [ -n "$UNLIKELIHOOD_ARGS" ] && pretrained=$PAIR-pretrained
  # Every stage generates with the target (its greedy sample, the unlikelihood term, the drafter's data) through a
  # captured CUDA graph: checked once per machine before anything trains on it.
  if [ ! -f /tmp/pair-generation-checked ]; then
    python3 -m pytest -q -p no:cacheprovider tests/test_train_target.py -m cuda -k "generation or greedy" 2>&1 \
      | tail -3 | tee -a "$OUT/pair.log"
    if [ "${PIPESTATUS[0]}" != 0 ]; then
      echo "the GPU generation tests failed: nothing trained" | tee -a "$OUT/pair.log"; exit 1
    fi
    touch /tmp/pair-generation-checked
  fi
  {
    train target "$pretrained" $(( ${TARGET_S:-420} < total - SECONDS - 30 ? ${TARGET_S:-420} : total - SECONDS - 30 )) \
      python3 -m engine train-target --out "$pretrained" --preset "$PRESET" --corpus-dir "$CORPUS" ${TARGET_ARGS:-}
    [ "$pretrained" != "$PAIR" ] && [ -f "$pretrained/training.json" ] && train unlikelihood "$PAIR" \
      $(( total - SECONDS - 30 )) python3 -m engine train-target --out "$PAIR" --preset "$PRESET" \
      --corpus-dir "$CORPUS" --init-from "$pretrained" $UNLIKELIHOOD_ARGS
    [ -f "$PAIR/training.json" ] && train drafter "$PAIR/dflash" $(( total - SECONDS - 30 )) \
      python3 -m engine train-drafter --target "$PAIR" --preset "$PRESET" --corpus-dir "$CORPUS" ${DRAFTER_ARGS:-}
  } 2>&1 | tee -a "$OUT/pair.log"
  wait
  # The furthest finished stage's files (no checkpoints) in parts under the 16 MiB a returned file may have:
  # cat pair.tar.part-* | tar -x
  furthest=$PAIR; [ -f "$PAIR/training.json" ] || furthest=$pretrained
  [ -f "$furthest/training.json" ] && tar -C "$(dirname "$furthest")" --exclude=checkpoints --exclude=sequences.pt \
    -cf - "$(basename "$furthest")" | split -b 15M - "$OUT/pair.tar.part-"
  if [ -f "$PAIR/dflash/training.json" ] && [ $(( total - SECONDS )) -ge 120 ]; then
    timeout $(( total - SECONDS )) python3 -m benchmarks.bench_pair --model "$PAIR" --device cuda \
      --corpus-dir "$CORPUS" ${BENCH_ARGS:-} --out "$OUT" 2>&1 | tee "$OUT/bench_pair.log"
  fi
fi

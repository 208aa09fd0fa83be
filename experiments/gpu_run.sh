#!/usr/bin/env bash
# One device run, in a lease of about 10 minutes, each stage under its own time limit so that a stage that hangs or
# fails leaves the others' results: the Mosaic GPU forward's oracle tests; which block sizes of the Triton kernels
# compile here (experiments.gpu_kernel_matrix); experiments.gpu_check (correctness, a short block-size sweep,
# baselines, decode, an LM step); experiments.op_speed for every op (B=1, H=8, d=64, bf16). Everything lands in
# $OUT (default results/gpu): env.txt, mosaic_test.txt, kernel_matrix.json, gpu_check.json, tuned.json (the best
# block sizes, for pallas_kernels/power_retention/tuned_block_sizes.json), op_speed_gpu.json and the logs.
#
#     OUT=/tmp/gpu BUDGET=540 bash experiments/gpu_run.sh      # BUDGET: seconds for all stages together
set -u
OUT=${OUT:-results/gpu}
BUDGET=${BUDGET:-540}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
START=$(date +%s)
left() { local n=$((BUDGET - ($(date +%s) - START))); echo $((n > 10 ? n : 10)); }
stage() { echo "=== [$(($(date +%s) - START)) s] $*"; }

stage env
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  $PY -c "import sys, jax, flax, optax, jaxtyping; print(sys.version); print('jax', jax.__version__, jax.devices());
print('flax', flax.__version__, 'optax', optax.__version__, 'jaxtyping', jaxtyping.__version__)"
  $PY -m pip list 2>/dev/null | grep -iE "^(torch|triton|jax-cuda|pytest) "
} 2>&1 | tee "$OUT/env.txt"

stage "mosaic forward against its oracles (pytest -k matches_oracle)"
timeout 110 $PY -m pytest -p no:cacheprovider -q -o addopts= tests/pallas_kernels/test_mosaic_forward.py \
  -k matches_oracle 2>&1 | tee "$OUT/mosaic_test.txt" | tail -25

stage "gpu_kernel_matrix: which block sizes of the Triton kernels compile here, and their errors"
timeout 180 $PY -m experiments.gpu_kernel_matrix --out "$OUT/kernel_matrix.json" 2>&1 |
  grep -vE "^E[0-9]{4}|Constant folding|^  %map|This isn|If you.d like|^$|slow_operation" | cut -c1-400

stage "gpu_check"
timeout $(($(left) > 200 ? $(left) - 170 : 30)) $PY -m experiments.gpu_check --max-minutes 1.2 --out "$OUT/gpu_check.json" \
  --tuned "$OUT/tuned.json" 2>&1 | tee "$OUT/gpu_check.log" | grep -v "^WARNING"

for lengths in "65536 --contexts 4096 65536" "4096 --skip-decode" "1024 --skip-decode" "16384 --skip-decode"; do
  [ "$(left)" -gt 10 ] || break
  stage "op_speed --lengths $lengths"
  # shellcheck disable=SC2086  # $lengths carries the length and its decode flags
  timeout "$(left)" $PY -m experiments.op_speed --dtype bfloat16 --repeats 10 --chunks 128 --keep-going --merge \
    --note "one H200, bf16, a 10-minute lease" --out "$OUT/op_speed_gpu.json" --lengths $lengths 2>&1 |
    tee -a "$OUT/op_speed.log" | grep -vE "^WARNING|it/s\]|s/it\]"
done
stage "done"
ls -la "$OUT"

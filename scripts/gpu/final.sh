#!/usr/bin/env bash
# One GPU call that checks and records a release: builds, tests (C++, bundle selftest, old
# Triton bundles, GPU pytest), then the step benchmark (default modes), the bf16 storage modes,
# the per-kernel breakdown and the C++ engine's host time. Logs and CSVs under $OUT.
set -u
OUT=${OUT:-$PWD/out}; export OUT
JOBS=${JOBS:-$(nproc)} bash scripts/gpu/session.sh env build bundle ctest verify oldbundles pytest 2>&1 | tail -n 12
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
timeout 240 python3 benchmarks/bench_step.py --out "$OUT/bench.csv" 2>&1 | tee "$OUT/bench.log" | tail -n 45
timeout 90 python3 benchmarks/bench_step.py --out "$OUT/bench-bf16.csv" --cases one-256M/bf16,gpt2-124m/bf16 \
  --modes adamw-rne,adamw-bf16m,adamw-bf16m-rne --impls luminamoon-triton 2>&1 | tee "$OUT/bench-bf16.log" | tail -n 8
for cm in "one-256M/fp32 clip" "one-256M/bf16 adamw-bf16m-rne"; do
  set -- $cm
  timeout 60 python3 benchmarks/bench_kernels.py --case $1 --mode $2 --out "$OUT/kernels.csv" 2>&1 | grep -E "per step|_kernel|host" | grep -v Warn
done
cli=$(find build/gpu -maxdepth 3 -type f -name luminav -perm -u+x | head -n 1)
timeout 60 "$cli" bench build/bundle --shapes gpt2 --dtype fp32 --steps 50 --csv "$OUT/luminav-bench.csv" 2>&1 | tail -n 6

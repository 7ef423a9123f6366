#!/usr/bin/env bash
set -u
OUT=${OUT:-$PWD/out}; export OUT
JOBS=${JOBS:-$(nproc)} bash scripts/gpu/session.sh env build bundle ctest verify oldbundles pytest 2>&1 | tail -n 25
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
for cm in "one-256M/bf16 adamw-bf16m-rne" "one-256M/fp32 clip" "gpt2-124m/fp32 adamw"; do
  set -- $cm
  timeout 150 python3 benchmarks/bench_kernels.py --case $1 --mode $2 --out $OUT/kernels.csv 2>&1 | grep -v Warn | grep -v _warn_once | tail -n 9
done
timeout 200 python3 benchmarks/bench_step.py --out $OUT/bench.csv --cases one-256M/fp32,one-256M/bf16,gpt2-124m/fp32,gpt2-124m/bf16 --modes adamw,clip,adamw-bf16m-rne --impls luminamoon-triton,torch-adamw-fused 2>&1 | tee $OUT/bench.log | tail -n 16

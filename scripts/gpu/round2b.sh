#!/usr/bin/env bash
set -u
OUT=${OUT:-$PWD/out}; export OUT
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
for cm in "one-256M/bf16 adamw-bf16m-rne" "one-256M/fp32 adamw" "one-256M/fp32 clip" "one-256M/bf16 adamw"; do
  set -- $cm
  timeout 150 python3 benchmarks/bench_kernels.py --case $1 --mode $2 --start-step 100000 --out $OUT/kernels.csv 2>&1 | grep -v Warn | grep -v _warn_once | tail -n 9
done
timeout 60 python3 scripts/gpu/host_profile.py 2>&1 | head -60
timeout 240 python3 benchmarks/tune_launch.py --configs 1024x4,2048x8,2048x4 --rblocks 8192x8,16384x16,32768x32 --mixes fp32,bf16/bf16 --out $OUT/tune.csv 2>&1 | tail -n 30

#!/usr/bin/env bash
# One GPU call that records the benchmark results: builds, then times the C++ engine, the cold
# start, the step benchmark (default modes) and the bf16 storage variants.
set -u
OUT=${OUT:-$PWD/out}; export OUT
JOBS=${JOBS:-$(nproc)} bash scripts/gpu/session.sh build bundle cbench cold
PYTHONPATH=$PWD/python python3 -m pytest tests/test_gpu_triton.py -q -p no:cacheprovider -k "nonfinite_skip" 2>&1 | tail -n 3
PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 python3 benchmarks/bench_step.py --out "$OUT/bench.csv" \
  --impls luminamoon-triton,torch-adamw-fused,torch-adamw-foreach 2>&1 | tee "$OUT/bench.log" | tail -n 45
PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 python3 benchmarks/bench_step.py --out "$OUT/bench-bf16.csv" \
  --cases one-256M/bf16,gpt2-124m/bf16,one-256M/fp32 --modes adamw-rne,adamw-bf16m,adamw-bf16m-rne \
  --impls luminamoon-triton 2>&1 | tee "$OUT/bench-bf16.log" | tail -n 12

#!/usr/bin/env bash
# scripts/gpu/kernel_ab.sh: this tree's Triton kernels (JIT) against another revision's
# (.prevtree/, `mkdir .prevtree && git archive REV python VERSION benchmarks | tar -x -C .prevtree`)
# in one call: bench_step on both, alternating, ROUNDS rounds (each tree's bench imports its own
# python/), the modes MODES of the cases CASES. CSVs and logs under $OUT.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
CASES=${CASES:-one-256M/bf16}
MODES=${MODES:-adamw,clip,adamw-bf16m,clip-bf16m,adamw-bf16m-rne}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for t in new prev; do
    b=benchmarks/bench_step.py; [ $t = prev ] && b=.prevtree/benchmarks/bench_step.py
    echo "=== $t round $r ($(date +%T))"
    timeout "${AB_LIMIT:-120}" python3 "$b" --cases "$CASES" --modes "$MODES" --impls luminamoon-triton \
      --steps 10 --out "$OUT/ab-$t-$r.csv" > "$OUT/ab-$t-$r.log" 2>&1; echo "    rc=$?"
    grep -E "^(one|gpt2|tiny|copy)" "$OUT/ab-$t-$r.log"
  done
done

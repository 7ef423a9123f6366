#!/usr/bin/env bash
# scripts/gpu/host_compare.sh: the host cost of a step of 1000 tiny tensors on the GPU
# (bench_host_step, triton backend) for several trees, alternating, so that the host's drift
# falls on every tree alike. Each tree is imported from its python/ folder (the triton backend
# needs no native module); this tree's benchmark script times them all.
# Usage: scripts/gpu/host_compare.sh ROUNDS TREE... (a TREE is a folder holding python/);
# MODES (default adamw,clip), GRADS ("kept new": both, the default) and OUT as in release.sh.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
rounds=$1; shift
for r in $(seq 1 "$rounds"); do
  for grads in ${GRADS:-kept new}; do
    flag=""; [ "$grads" = new ] && flag="--new-grads"
    for tree in "$@"; do
      echo "=== round $r, $grads grads, $tree"
      python3 benchmarks/bench_host_step.py --backend triton --device cuda --tensors 1000 \
        --modes "${MODES:-adamw,clip}" --repeat 3 --steps 200 --breakdown $flag \
        --src "$tree/python" 2>&1 | tail -n +2 | tee -a "$OUT/host-$(basename "$(cd "$tree" && pwd)")-$grads.log"
    done
  done
done

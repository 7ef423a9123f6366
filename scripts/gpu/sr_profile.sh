#!/usr/bin/env bash
# scripts/gpu/sr_profile.sh: one GPU call on the stochastic-rounding kernels of #14's targets:
#   ab       this tree's kernels against .prevtree's (kernel_ab.sh, ROUNDS rounds)
#   sr       release.sh's sr stage on this tree's python/ (the SR modes beside the peers, .whl/)
#   ncu      Nsight Compute on one step of each 16-bit-moment mode (256M bf16 elements): the
#            passes' throughput, issue-slot use and warp stall reasons (where ncu exists)
# Usage: scripts/gpu/sr_profile.sh [stage ...] (default: ab sr ncu); logs and CSVs under $OUT.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(ab sr ncu)
has() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
if has ab; then
  echo "=== ab ($(date +%T))"
  ROUNDS=${ROUNDS:-2} CASES=${CASES:-one-256M/bf16} MODES=${MODES:-adamw-bf16m,clip-bf16m,adamw,clip} \
    bash scripts/gpu/kernel_ab.sh
fi
if has sr; then
  SR_SRC=$PWD/python bash scripts/gpu/release.sh sr
fi
if has ncu; then
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  echo "=== ncu ($(date +%T)) ${NCU:-none}"
  if [ -n "$NCU" ]; then
    for mode in clip-bf16m adamw-bf16m; do
      timeout "${NCU_LIMIT:-150}" "$NCU" --target-processes all -k "regex:_lumina_" --launch-skip 6 --launch-count 3 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
        --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis \
        env PYTHONPATH="$PWD/python" python3 benchmarks/bench_step.py --cases one-256M/bf16 \
        --modes "$mode" --impls luminamoon-triton --steps 2 > "$OUT/ncu-$mode.txt" 2>&1
      echo "    $mode rc=$?"
      grep -E "_lumina_|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|Issued Ipc|Executed Ipc|No Eligible|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Executed Instructions  " "$OUT/ncu-$mode.txt" | head -n 60
    done
  fi
fi

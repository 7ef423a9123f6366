#!/usr/bin/env bash
# scripts/gpu/host_session.sh: one GPU call for the plan check's host cost: the plan-check tests
# on CUDA tensors (this tree's python/, torch's one-call pointer comparison where the build has
# it), host_compare.sh over this tree, .prevtree/ and .oldtree/ (three rounds, kept and new
# gradients), then release.sh's build and doctor stages. Logs under $OUT. A tree from a revision:
#   mkdir .prevtree && git archive REV python VERSION | tar -x -C .prevtree
# (VERSION too: a source tree's package reads its version from it).
set -u
export OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -c "import torch, triton, sys; print(torch.__version__, triton.__version__, torch.version.cuda, torch.cuda.get_device_name(0), sys.version.split()[0], 'one-call pointer comparison:', hasattr(torch._C, '_tensors_data_ptrs_at_indices_equal'))"
lscpu | grep "Model name"
echo "=== plan check tests on cuda ($(date +%T))"
timeout 120 env PYTHONPATH=python python3 -m pytest tests/test_plan_check.py -q -ra -p no:cacheprovider 2>&1 | tail -4
echo "=== host compare ($(date +%T))"
timeout "${HOST_LIMIT:-330}" bash scripts/gpu/host_compare.sh "${ROUNDS:-3}" . .prevtree .oldtree > "$OUT/host_compare.txt" 2>&1
echo "rc=$? ($(date +%T))"
grep -v "^#" "$OUT/host_compare.txt" | head -120
echo "=== build doctor ($(date +%T))"
TAILN=10 timeout 200 bash scripts/gpu/release.sh build doctor 2>&1 | tail -30
echo "=== end ($(date +%T))"

#!/usr/bin/env bash
# scripts/gpu/compare.sh: one GPU call that checks this tree's kernels and measures them beside
# an older tree's (.oldtree/, e.g. `git archive <rev> | tar -x -C .oldtree`) in the same run.
# Builds both packages, this tree's bundle, runs the GPU rows of the backend matrix and the
# JIT-vs-AOT test, then bench_step on both trees and the stochastic-rounding modes beside the
# peers (.whl/ wheels: torchao, torch-optimi). Everything under $OUT; each stage has a limit.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
J=$(nproc)
deps="-DCMAKE_PREFIX_PATH=$PWD/.deps -DOPENSSL_ROOT_DIR=$PWD/.deps -DOPENSSL_USE_STATIC_LIBS=TRUE"
stage() { local name=$1 limit=$2; shift 2; echo "=== $name ($(date +%T))";
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "    rc=$? ($(date +%T))"; tail -n "${TAILN:-6}" "$OUT/$name.log"; }

python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$OUT/wheels.log" 2>&1
# both packages at once (16 cores)
(CMAKE_ARGS="$deps" CMAKE_BUILD_PARALLEL_LEVEL=$J python3 -m pip install -q --no-build-isolation \
   --no-deps --target /tmp/new . > "$OUT/build-new.log" 2>&1; echo "new rc=$?") &
(cd .oldtree && CMAKE_ARGS="$deps" CMAKE_BUILD_PARALLEL_LEVEL=$J python3 -m pip install -q \
   --no-build-isolation --no-deps --target /tmp/old . > "$OUT/build-old.log" 2>&1; echo "old rc=$?") &
wait
tail -n 3 "$OUT/build-new.log"
stage bundle 150 env PYTHONPATH=/tmp/new python3 -m luminamoon aot build --arch 90 --out /tmp/bundle --jobs "$J" --quiet
TAILN=12 stage pytest-gpu ${PYTEST_LIMIT:-150} env PYTHONPATH=/tmp/new LUMINAMOON_TEST_BUNDLE=/tmp/bundle \
  python3 -m pytest tests/test_backends.py tests/test_gpu_aot_variants.py tests/test_gpu_triton.py \
  -m gpu -q -ra -p no:cacheprovider --timeout 240 -x
# before and after, one run each, the same cases (the old tree's bench imports its own sources)
CASES=one-256M/fp32,one-256M/bf16,gpt2-124m/fp32,gpt2-124m/bf16,tiny-1000/fp32
TAILN=25 stage bench-new 80 python3 benchmarks/bench_step.py --cases $CASES --impls luminamoon-triton --steps 10 --out "$OUT/bench-new.csv"
TAILN=25 stage bench-old 80 python3 .oldtree/benchmarks/bench_step.py --cases $CASES --impls luminamoon-triton --steps 10 --out "$OUT/bench-old.csv"
# stochastic rounding beside the peers (and the old tree's format-1 kernels)
TAILN=30 stage bench-sr ${SR_LIMIT:-150} env PYTHONPATH=/tmp/site python3 benchmarks/bench_step.py \
  --cases one-256M/bf16,gpt2-124m/bf16 --modes adamw,clip,adamw-bf16m,clip-bf16m,adamw-bf16m-rne \
  --impls luminamoon-triton,torch-adamw-fused,torchao-adamw-bf16sr,optimi-adamw --steps 10 --out "$OUT/bench-sr.csv"
echo "=== done $(date +%T)"

#!/usr/bin/env bash
# scripts/gpu/release.sh: one GPU call that checks a release and measures it beside an older
# tree (.oldtree/, e.g. `git archive <rev> | tar -x -C .oldtree`), from the repository root.
#   build     pip install --target build/gpu-new (the native module, the luminav command, the
#             default bundle compiled here); a test bundle of every variant for sm_90, or with
#             TEST_BUNDLE=default none: pytest then takes the default bundle (the same variants)
#   doctor    luminamoon doctor's verdict, luminav verify --require-gpu and selftest of the
#             default bundle
#   pytest    every test with the marker gpu (a test bundle of every variant for sm_90)
#   bench     bench_step on both trees (each imports its own python/), the same cases, one run each
#   sr        the stochastic-rounding modes beside the peers (.whl/: torchao, torch-optimi)
#   host      bench_host_step on both trees (and this one without its native module): the host
#             cost of a step of 1000 tiny tensors, with the plan check's parts
#   conv      bench_bf16_convergence: pure bf16 with stochastic rounding, nearest, fp32 (curves)
#   releases  luminav verify --require-gpu and selftest of bundles other Triton releases built
#             (build/mxb/triton-*/, from the matrix's --keep-bundles or luminamoon aot build)
#   packaging scripts/gpu/packaging.sh's aot and cold stages on the build above
#   demo      luminamoon demo on the GPU (its results under $OUT/demo)
#   campaign  scripts/gpu/bundle_campaign.py (its summary under $OUT/campaign)
# Usage: scripts/gpu/release.sh [stage ...]; logs and CSVs under $OUT.
# One call that checks a tree and compares it with .oldtree (the GPU suite, verify/selftest, and
# bench_step and the host cost before and after): TEST_BUNDLE=default PYTEST_LIMIT=340
# scripts/gpu/release.sh build doctor pytest bench host: about 560 s on an H100 machine
# (build ~100 s, doctor ~20, pytest ~315, bench ~45, host ~75).
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
J=$(nproc)
NEW=$PWD/build/gpu-new TB=$PWD/build/gpu-test-bundle
deps="-DCMAKE_PREFIX_PATH=$PWD/.deps -DOPENSSL_ROOT_DIR=$PWD/.deps -DOPENSSL_USE_STATIC_LIBS=TRUE"
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(build doctor pytest bench sr)
stage() { local name=$1 limit=$2; shift 2; echo "=== $name ($(date +%T))";
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "    rc=$? ($(date +%T))"; tail -n "${TAILN:-6}" "$OUT/$name.log"; }
has() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
if has build; then
  CMAKE_ARGS="$deps" CMAKE_BUILD_PARALLEL_LEVEL=$J python3 -m pip install -q --no-build-isolation \
     --no-deps --target "$NEW" . > "$OUT/build-new.log" 2>&1; echo "new rc=$?"
  wait
  tail -n 3 "$OUT/build-new.log"
  [ "${TEST_BUNDLE:-}" = default ] || stage test-bundle 150 env PYTHONPATH="$NEW" python3 -m luminamoon aot build --arch 90 --out "$TB" --jobs "$J" --quiet
fi
export PATH=$NEW/bin:$PATH
if has doctor; then
  TAILN=30 stage doctor 120 bash -c "PYTHONPATH=$NEW python3 -m luminamoon doctor; b=\$(PYTHONPATH=$NEW python3 -m luminamoon aot default); luminav verify \"\$b\" --require-gpu | tail -n 3; luminav selftest \"\$b\" | tail -n 5"
fi
if has pytest; then
  [ "${TEST_BUNDLE:-}" = default ] && TB=$(PYTHONPATH="$NEW" python3 -m luminamoon aot default)
  TAILN=14 stage pytest-gpu ${PYTEST_LIMIT:-240} env PYTHONPATH="$NEW" LUMINAMOON_TEST_BUNDLE="$TB" \
    python3 -m pytest tests -m gpu ${PYTEST_ARGS:--q} -ra -p no:cacheprovider --timeout 200
fi
CASES=${CASES:-one-256M/fp32,one-256M/bf16,gpt2-124m/fp32,gpt2-124m/bf16,tiny-1000/fp32}
if has bench; then
  TAILN=25 stage bench-new 100 env PYTHONPATH="$NEW" python3 benchmarks/bench_step.py --cases $CASES --impls luminamoon-triton --steps 10 --out "$OUT/bench-new.csv"
  TAILN=25 stage bench-old 100 python3 .oldtree/benchmarks/bench_step.py --cases $CASES --impls luminamoon-triton --steps 10 --out "$OUT/bench-old.csv"
fi
if has sr; then
  # the peers' wheels (once a machine); SR_SRC: the luminamoon to import
  # (default the build above; a tree's python/ for its Triton kernels alone)
  [ -d build/gpu-site ] || python3 -m pip install -q --no-index --no-deps --target build/gpu-site .whl/*.whl > "$OUT/wheels.log" 2>&1
  TAILN=30 stage bench-sr ${SR_LIMIT:-150} env PYTHONPATH="${SR_SRC:-$NEW}:$PWD/build/gpu-site" python3 benchmarks/bench_step.py \
    --cases one-256M/bf16,gpt2-124m/bf16 --modes adamw,clip,adamw-bf16m,clip-bf16m,adamw-bf16m-rne \
    --impls luminamoon-triton,torch-adamw-fused,torchao-adamw-bf16sr,optimi-adamw --steps 10 --out "$OUT/bench-sr.csv"
fi
if has host; then
  H="benchmarks/bench_host_step.py --backend triton --device cuda --tensors 1000 --modes adamw,clip,clip-rel --repeat 3 --breakdown"
  TAILN=8 stage host-new 100 python3 $H --src "$NEW"
  TAILN=8 stage host-new-py 100 python3 $H --src python   # the same tree without its native module
  TAILN=8 stage host-old 100 python3 $H --src .oldtree/python
fi
if has conv; then
  TAILN=8 stage conv ${CONV_LIMIT:-240} env PYTHONPATH="$NEW" python3 benchmarks/bench_bf16_convergence.py --csv "$OUT/conv.csv"
fi
if has releases; then
  for b in build/mxb/triton-*/; do
    [ -f "$b/manifest.json" ] || continue
    TAILN=4 stage "release-$(basename "$b")" 90 bash -c "luminav verify '$b' --require-gpu | tail -n 2; luminav selftest '$b' | tail -n 1"
  done
fi
if has packaging; then
  TAILN=12 stage packaging 120 env TARGET="$NEW" OUT="$OUT" bash scripts/gpu/packaging.sh aot
  TAILN=30 stage cold-start ${COLD_LIMIT:-150} env PYTHONPATH="$NEW" python3 benchmarks/cold_start.py --device cuda --repeats ${COLD_REPEATS:-2} --out-stem "$OUT/cold-start"
fi
if has demo; then
  TAILN=30 stage demo ${DEMO_LIMIT:-240} env PYTHONPATH="$NEW" python3 -m luminamoon demo --out "$OUT/demo"
fi
if has campaign; then
  mkdir -p "$OUT/campaign"
  TAILN=30 stage campaign ${CAMPAIGN_LIMIT:-330} python3 scripts/gpu/bundle_campaign.py --out "$OUT/campaign" --require-gpu
fi
echo "=== done $(date +%T)"

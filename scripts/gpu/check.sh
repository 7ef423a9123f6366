#!/usr/bin/env bash
# scripts/gpu/check.sh: the one GPU check of a tree, in one call, from the repository root; each
# stage has a time limit, its log and CSVs go under $OUT (default ./out).
#
#   env        versions: GPU, driver, Python, torch, Triton, CUDA, CMake
#   build      pip install --target build/gpu-new (EXTRA_CMAKE_ARGS added; the native module, the luminav command, the
#              default bundle compiled here); then a test bundle of every variant for this GPU's
#              arch (build/gpu-test-bundle), or none with TEST_BUNDLE=default (the tests then take
#              the default bundle: the same variants)
#   doctor     luminamoon doctor's verdict; luminav verify --require-gpu and selftest of the
#              default bundle and of the test bundle (GPU kernels against the C++ CPU engine)
#   bundles    luminav verify --require-gpu and selftest of bundles other Triton releases built
#              (.bundles/*/, build/mxb/triton-*/), loaded with no Triton involved
#   ctest      the C++ tests (CMake build in build/gpu-ctest) with the test bundle, then the C++
#              training example on cuda and cpu
#   pytest     every test with the marker gpu (PYTEST_ARGS, PYTEST_LIMIT)
#   bench      bench_step of this tree and of .oldtree/, alternating, ROUNDS (2) rounds; CASES,
#              MODES (default bench_step's own modes)
#   host       bench_host_step (1000 tiny tensors, the plan check's parts) of this tree, this tree
#              without its native module and .oldtree/, alternating, ROUNDS rounds; GRADS="kept
#              new" times new gradient tensors each step too
#   sr         the stochastic-rounding modes beside the peers (.whl/: torchao, torch-optimi)
#   q8         q8 moments: bench_step's adamw-q8 and clip-q8 rows (and fp32 moments' adamw) beside
#              torchao's and bitsandbytes' AdamW8bit (.whl/, installed into build/gpu-site), on
#              Q8_CASES (default the 256M tensor and GPT-2 124M, bf16 and fp32 params); then
#              bench_q8_quality (Q8_RUNS: its runs, default all four; Q8_QUALITY_ARGS), PYTHONPATH
#              Q8_SRC (default the build, else this tree's python/) and build/gpu-site; about
#              8 min on an H100 (Q8_BENCH_LIMIT 300 s, Q8_QUALITY_LIMIT 330 s); Q8_PARTS=bench
#              or Q8_PARTS=quality runs one of the two
#   kernels    bench_kernels: device time per kernel of one step
#   cbench     luminav bench: the C++ engine's host time per step
#   tune       tune_launch: launch shapes of the update kernels
#   conv       bench_bf16_convergence: pure bf16 with stochastic rounding, nearest, fp32
#   profile    cProfile of steps (scripts/gpu/host_profile.py)
#   ncu        Nsight Compute on one step of each 16-bit-moment mode (where ncu exists)
#   cold       bench_cold_start: a fresh process's first step (Python aot, triton, C++)
#   packaging  scripts/gpu/packaging.sh's aot and cold stages on the build above
#   demo       luminamoon demo on the GPU (results under $OUT/demo)
#   campaign   scripts/gpu/bundle_campaign.py (summary under $OUT/campaign)
#
# Usage: scripts/gpu/check.sh STAGE... (default: env build doctor pytest bench host).
# The old tree for bench and host: `mkdir .oldtree && git archive REV | tar -x -C .oldtree`
# (each tree's benchmark imports its own python/); OLD="DIR..." names other folders, e.g.
# OLD=".prevtree .oldtree". IMPLS: bench_step's implementations (default LuminaMoon's own).
# DRY_RUN=1 prints each stage's command instead of running it. CHECK_DEVICE=cpu runs bench and
# host on CPU tensors with the reference backend, a check of the script itself on a machine with
# no GPU (NEW=DIR then names this tree's package, e.g. NEW=$PWD/python where the module is built
# in place; bench_step's copy ceiling alone takes minutes on a small CPU).
# The whole check of a tree against an older one (about 560 s on an H100 machine):
#   TEST_BUNDLE=default PYTEST_LIMIT=340 scripts/gpu/check.sh build doctor pytest bench host
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
J=${JOBS:-$(nproc)}
PY=${PY:-python3}
NEW=${NEW:-$PWD/build/gpu-new} TB=$PWD/build/gpu-test-bundle OLD=${OLD:-.oldtree}
DEVICE=${CHECK_DEVICE:-cuda} DRY=${DRY_RUN:-0}
ROUNDS=${ROUNDS:-2}
deps="-DCMAKE_PREFIX_PATH=$PWD/.deps -DOPENSSL_ROOT_DIR=$PWD/.deps -DOPENSSL_USE_STATIC_LIBS=TRUE"
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(env build doctor pytest bench host)
known=" env build doctor bundles ctest pytest bench host sr q8 kernels cbench tune conv profile ncu cold packaging demo campaign "
for s in "${stages[@]}"; do
  case "$known" in *" $s "*) ;; *) echo "unknown stage '$s'; stages:$known" >&2; exit 2 ;; esac
done
has() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
failed=()
# stage NAME LIMIT_S CMD...: runs CMD under a time limit into $OUT/NAME.log, prints its tail
stage() {
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date +%T))"
  if [ "$DRY" = 1 ]; then printf '    would run:'; printf ' %q' "$@"; echo; return 0; fi
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "    rc=$rc ($(date +%T))"; [ $rc -eq 0 ] || failed+=("$name")
  tail -n "${TAILN:-6}" "$OUT/$name.log"
}
luminav_in() { find "$1" -maxdepth 3 -type f -name luminav -perm -u+x 2>/dev/null | head -n 1; }

if [ "$DEVICE" = cuda ]; then
  ARCH=${ARCH:-$($PY -c "import torch; m, n = torch.cuda.get_device_capability(); print(m * 10 + n)" 2>/dev/null || echo 90)}
  IMPL=luminamoon-triton HOST_BACKEND=${HOST_BACKEND:-triton}
  CASES=${CASES:-one-256M/fp32,one-256M/bf16,gpt2-124m/fp32,gpt2-124m/bf16,tiny-1000/fp32}
  Q8_CASES=${Q8_CASES:-one-256M/bf16,one-256M/fp32,gpt2-124m/bf16,gpt2-124m/fp32}
else
  ARCH=${ARCH:-90}  # (the bundle is compiled for a GPU arch, with or without one here)
  IMPL=luminamoon-reference HOST_BACKEND=${HOST_BACKEND:-reference}
  CASES=${CASES:-tiny-1000/fp32}
  Q8_CASES=${Q8_CASES:-small-mixed/fp32} Q8_QUALITY_ARGS=${Q8_QUALITY_ARGS:---quick}
fi
export PATH=$NEW/bin:$PATH

if has env; then
  stage env 60 bash -c "nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader 2>&1 | head -n 4; $PY -c \"import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')\"; cmake --version | head -n 1; lscpu | grep 'Model name'"
fi
if has build; then
  stage build-new 600 env CMAKE_ARGS="$deps ${EXTRA_CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL="$J" $PY -m pip install -q \
    --no-build-isolation --no-deps --upgrade --target "$NEW" .
  [ "${TEST_BUNDLE:-}" = default ] || stage test-bundle 300 env PYTHONPATH="$NEW" $PY -m luminamoon aot build \
    --arch "$ARCH" --out "$TB" --jobs "$J" --quiet
fi
[ "${TEST_BUNDLE:-}" = default ] && { has pytest || has ctest; } && [ "$DRY" != 1 ] && TB=$(PYTHONPATH="$NEW" $PY -m luminamoon aot default)
if has doctor; then
  TAILN=30 stage doctor 120 bash -c "PYTHONPATH=$NEW $PY -m luminamoon doctor; b=\$(PYTHONPATH=$NEW $PY -m luminamoon aot default); luminav verify \"\$b\" --require-gpu | tail -n 3; luminav selftest \"\$b\" | tail -n 5; if [ -d $TB ]; then luminav verify $TB --require-gpu | tail -n 3; luminav selftest $TB | tail -n 5; fi"
fi
if has bundles; then
  for b in .bundles/*/ build/mxb/triton-*/; do
    [ -f "$b/manifest.json" ] || continue
    TAILN=4 stage "bundle-$(basename "$b")" 90 bash -c "luminav verify '$b' --require-gpu | tail -n 2; luminav selftest '$b' | tail -n 1"
  done
fi
if has ctest; then
  CT=build/gpu-ctest
  TAILN=25 stage ctest 600 bash -c "cmake -S . -B $CT -G Ninja -DCMAKE_BUILD_TYPE=Release -DLUMINAV_BUILD_TESTS=ON -DLUMINAV_BUILD_PYTHON=OFF $( [ -d .deps ] && echo "$deps" ) && cmake --build $CT -j $J && cd $CT && LUMINAV_TEST_BUNDLE=$TB ctest --output-on-failure -j 8"
  TAILN=8 stage example 120 bash -c "ex=\$(find $CT -type f -name 'luminav_train*' -perm -u+x | head -n 1); [ -n \"\$ex\" ] && \"\$ex\" --device cuda --bundle $TB && \"\$ex\" --device cpu"
fi
if has pytest; then
  TAILN=14 stage pytest-gpu "${PYTEST_LIMIT:-300}" env PYTHONPATH="$NEW" LUMINAMOON_TEST_BUNDLE="$TB" \
    $PY -m pytest tests -m gpu ${PYTEST_ARGS:--q} -ra -p no:cacheprovider --timeout 200 --junitxml="$OUT/pytest-gpu.xml"
fi
# bench_step before and after, alternating, the same cases (each tree's bench_step imports its
# own python/ first)
if has bench; then
  for r in $(seq 1 "$ROUNDS"); do
    TAILN=25 stage "bench-new-$r" "${BENCH_LIMIT:-120}" $PY benchmarks/bench_step.py \
      --device "$DEVICE" --cases "$CASES" ${MODES:+--modes "$MODES"} --impls "${IMPLS:-$IMPL}" --steps 10 --out "$OUT/bench-new.csv"
    for o in $OLD; do
      [ -d "$o" ] || { echo "    (no $o/: that tree is left out)"; continue; }
      TAILN=25 stage "bench-$(basename "$o")-$r" "${BENCH_LIMIT:-120}" $PY "$o/benchmarks/bench_step.py" \
        --device "$DEVICE" --cases "$CASES" ${MODES:+--modes "$MODES"} --impls "${IMPLS:-$IMPL}" --steps 10 \
        --out "$OUT/bench-$(basename "$o").csv"
    done
  done
fi
# the host cost of a step of 1000 tiny tensors: this tree (built, and its sources without the
# native module) and the old tree, alternating so that the host's drift falls on each alike
if has host; then
  H="benchmarks/bench_host_step.py --backend $HOST_BACKEND --device $DEVICE --tensors ${HOST_TENSORS:-1000} --modes ${HOST_MODES:-adamw,clip,clip-rel} --repeat 3 --breakdown"
  [ "$DEVICE" = cpu ] && H="$H --steps ${HOST_STEPS:-50} --warmup 2"
  for r in $(seq 1 "$ROUNDS"); do
    for grads in ${GRADS:-kept}; do
      flag=""; [ "$grads" = new ] && flag="--new-grads"
      TAILN=8 stage "host-new-$grads-$r" 150 $PY $H $flag --src "$NEW"
      TAILN=8 stage "host-new-py-$grads-$r" 150 $PY $H $flag --src python
      for o in $OLD; do
        [ -d "$o" ] && TAILN=8 stage "host-$(basename "$o")-$grads-$r" 150 $PY $H $flag --src "$o/python"
      done
    done
  done
fi
if has sr; then
  # the peers' wheels (once a machine); SR_SRC: the luminamoon to import (default the build)
  [ -d build/gpu-site ] || [ "$DRY" = 1 ] || $PY -m pip install -q --no-index --no-deps --target build/gpu-site .whl/*.whl > "$OUT/wheels.log" 2>&1
  TAILN=30 stage bench-sr "${SR_LIMIT:-150}" env PYTHONPATH="${SR_SRC:-$NEW}:$PWD/build/gpu-site" $PY benchmarks/bench_step.py \
    --cases one-256M/bf16,gpt2-124m/bf16 --modes adamw,clip,adamw-bf16m,clip-bf16m,adamw-bf16m-rne \
    --impls luminamoon-triton,torch-adamw-fused,torchao-adamw-bf16sr,optimi-adamw --steps 10 --out "$OUT/bench-sr.csv"
fi
if has q8; then
  # the peers' wheels (.whl/: bitsandbytes with its CUDA 13 library, torchao), once a machine
  if [ "$DRY" != 1 ] && ! { [ -d build/gpu-site/bitsandbytes ] && [ -d build/gpu-site/torchao ]; }; then
    $PY -m pip install -q --no-index --no-deps --upgrade --target build/gpu-site .whl/*.whl > "$OUT/wheels-q8.log" 2>&1 \
      || echo "    (installing .whl/*.whl failed: $OUT/wheels-q8.log; the peers' rows will say why)"
  fi
  Q8_PATH="${Q8_SRC:-$([ -d "$NEW/luminamoon" ] && echo "$NEW" || echo "$PWD/python")}:$PWD/build/gpu-site"
  case " ${Q8_PARTS:-bench quality} " in *" bench "*)
  TAILN=40 stage bench-q8 "${Q8_BENCH_LIMIT:-300}" env PYTHONPATH="$Q8_PATH" $PY benchmarks/bench_step.py \
    --device "$DEVICE" --cases "$Q8_CASES" \
    --modes adamw,adamw-q8,clip-q8 --impls "${IMPLS:-$IMPL},torch-adamw-fused,torchao-adamw8bit,bnb-adamw8bit" \
    --steps 10 --out "$OUT/bench-q8.csv" ;; esac
  case " ${Q8_PARTS:-bench quality} " in *" quality "*)
  TAILN=16 stage q8-quality "${Q8_QUALITY_LIMIT:-330}" env PYTHONPATH="$Q8_PATH" $PY benchmarks/bench_q8_quality.py \
    --device "$DEVICE" ${Q8_RUNS:+--runs "$Q8_RUNS"} ${Q8_QUALITY_ARGS:-} --out "$OUT/q8-quality" ;; esac
fi
if has kernels; then
  for cm in "one-256M/fp32 clip" "one-256M/bf16 adamw-bf16m-rne"; do
    set -- $cm
    TAILN=12 stage "kernels-${2}" 90 env PYTHONPATH="$NEW" $PY benchmarks/bench_kernels.py --case "$1" --mode "$2" --out "$OUT/kernels.csv"
  done
fi
if has cbench; then
  B=$TB; [ -d "$B" ] || B='$(luminamoon aot default)'
  TAILN=10 stage cbench 180 bash -c "b=$B; luminav bench \"\$b\" --shapes gpt2 --dtype fp32 --steps 50 --csv $OUT/luminav-bench.csv && luminav bench \"\$b\" --shapes gpt2 --dtype bf16 --groups 4 --steps 50 --csv $OUT/luminav-bench.csv && luminav bench \"\$b\" --tensors 1000 --numel 4096 --steps 50 --csv $OUT/luminav-bench.csv"
fi
if has tune; then
  TAILN=20 stage tune "${TUNE_LIMIT:-300}" env PYTHONPATH="$NEW" $PY benchmarks/tune_launch.py --out "$OUT/tune.csv" ${TUNE_ARGS:-}
fi
if has conv; then
  TAILN=8 stage conv "${CONV_LIMIT:-240}" env PYTHONPATH="$NEW" $PY benchmarks/bench_bf16_convergence.py --csv "$OUT/conv.csv"
fi
if has profile; then
  TAILN=40 stage profile 150 $PY scripts/gpu/host_profile.py --src "$NEW" ${PROFILE_ARGS:-}
fi
if has ncu; then
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  for mode in ${NCU_MODES:-clip-bf16m adamw-bf16m}; do
    [ -n "$NCU" ] || [ "$DRY" = 1 ] || { echo "=== ncu: no ncu on this machine"; break; }
    TAILN=60 stage "ncu-$mode" "${NCU_LIMIT:-150}" "${NCU:-ncu}" --target-processes all -k "regex:_lumina_" \
      --launch-skip 6 --launch-count 3 --section SpeedOfLight --section LaunchStats --section Occupancy \
      --section SchedulerStats --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis \
      env PYTHONPATH="$NEW" $PY benchmarks/bench_step.py --cases one-256M/bf16 --modes "$mode" \
      --impls luminamoon-triton --steps 2
  done
fi
if has cold; then
  TAILN=20 stage cold 300 env PYTHONPATH="$NEW" $PY benchmarks/bench_cold_start.py --bundle "$TB" \
    --luminav "$NEW/bin/luminav" --repeats 3 --out "$OUT/cold-start.csv"
fi
if has packaging; then
  TAILN=12 stage packaging 200 env TARGET="$NEW" OUT="$OUT" bash scripts/gpu/packaging.sh aot cold
fi
if has demo; then
  TAILN=30 stage demo "${DEMO_LIMIT:-240}" env PYTHONPATH="$NEW" $PY -m luminamoon demo --out "$OUT/demo"
fi
if has campaign; then
  mkdir -p "$OUT/campaign"
  TAILN=30 stage campaign "${CAMPAIGN_LIMIT:-330}" $PY scripts/gpu/bundle_campaign.py --out "$OUT/campaign" --require-gpu
fi
echo "=== done $(date +%T): ${#failed[@]} stage(s) failed${failed[*]:+: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]

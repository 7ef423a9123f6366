#!/usr/bin/env bash
# Runs on a CUDA machine, from the repository root: builds the native runtime and its Python
# module, runs the GPU tests, builds an AOT bundle, verifies and self-tests it, and benchmarks.
# Usage: scripts/gpu/session.sh [stage ...]   (default: every stage)
# Stages: env build bundle ctest verify oldbundles pytest example bench tune cbench cold
# Logs and results go to $OUT (default ./out). A `.deps/` prefix (headers/libraries the build
# needs where the system lacks them) is used when present.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-build/gpu}
BUNDLE=${BUNDLE:-build/bundle}
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(env build bundle ctest verify pytest example bench)
status=0
declare -A result

run_stage() {
  local name=$1; shift
  echo "=== $name ($(date +%T))"
  local t0=$SECONDS
  if "$@" > "$OUT/$name.log" 2>&1; then result[$name]="ok ($((SECONDS - t0)) s)"
  else result[$name]="FAILED ($((SECONDS - t0)) s)"; status=1; fi
  tail -n 25 "$OUT/$name.log"
}

cmake_args=(-DLUMINAV_BUILD_TESTS=ON -DLUMINAV_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v $PY)")
if [ -d .deps ]; then
  cmake_args+=(-DCMAKE_PREFIX_PATH="$PWD/.deps" -DOPENSSL_ROOT_DIR="$PWD/.deps")
fi

s_env() {
  nvidia-smi; $PY -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  nvcc --version | tail -n 2; cmake --version | head -n 1
  ls /usr/include/nlohmann /usr/include/openssl/evp.h /usr/include/gtest 2>&1 | head -n 5
}
s_build() {
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" && cmake --build "$BUILD" -j "$JOBS"
}
s_ctest() { (cd "$BUILD" && LUMINAV_TEST_BUNDLE=$PWD/../../$BUNDLE ctest --output-on-failure -j 8); }
s_bundle() { $PY -m luminamoon.aot build --arch 90 --out "$BUNDLE" --jobs "$JOBS"; }
s_verify() {
  local cli; cli=$(find "$BUILD" -maxdepth 3 -type f -name luminav -perm -u+x | head -n 1)
  "$cli" inspect "$BUNDLE" | head -n 20 && "$cli" verify "$BUNDLE" && "$cli" selftest "$BUNDLE"
}
s_pytest() {
  LUMINAMOON_TEST_BUNDLE=$PWD/$BUNDLE $PY -m pytest tests -m "gpu" -q -ra -p no:cacheprovider --junitxml="$OUT/pytest-gpu.xml"
}
s_bench() { $PY benchmarks/bench_step.py --out "$OUT/bench.csv" ${BENCH_ARGS:-}; }
s_example() {
  local ex; ex=$(find "$BUILD" -type f -name 'luminav_train*' -perm -u+x | head -n 1)
  [ -n "$ex" ] && "$ex" --device cuda --bundle "$BUNDLE" && "$ex" --device cpu
}

# Bundles built elsewhere by other Triton releases (0, 1 or 2 trailing scratch pointers): the
# runtime must load, verify and self-test them with no Triton involved.
s_oldbundles() {
  local cli; cli=$(find "$BUILD" -maxdepth 3 -type f -name luminav -perm -u+x | head -n 1)
  local rc=0 d
  for d in .bundles/*/; do
    [ -f "$d/manifest.json" ] || continue
    echo "--- $d"; "$cli" verify "$d" --require-gpu | tail -n 2 && "$cli" selftest "$d" | tail -n 1 || rc=1
  done
  return $rc
}
s_tune() { $PY benchmarks/tune_launch.py --out "$OUT/tune.csv" ${TUNE_ARGS:-}; }
s_cbench() {
  local cli; cli=$(find "$BUILD" -maxdepth 3 -type f -name luminav -perm -u+x | head -n 1)
  "$cli" bench "$BUNDLE" --shapes gpt2 --dtype fp32 --steps 50 --csv "$OUT/luminav-bench.csv" &&
  "$cli" bench "$BUNDLE" --shapes gpt2 --dtype bf16 --groups 4 --steps 50 --csv "$OUT/luminav-bench.csv" &&
  "$cli" bench "$BUNDLE" --tensors 1000 --numel 4096 --steps 50 --csv "$OUT/luminav-bench.csv"
}
s_cold() { $PY benchmarks/bench_cold_start.py --bundle "$BUNDLE" --luminav "$(find "$BUILD" -maxdepth 3 -type f -name luminav -perm -u+x | head -n 1)" --repeats 3 --out "$OUT/cold-start.csv"; }

for s in "${stages[@]}"; do run_stage "$s" "s_$s"; done
echo "=== summary"
for s in "${stages[@]}"; do printf '%-8s %s\n' "$s" "${result[$s]}"; done
exit $status

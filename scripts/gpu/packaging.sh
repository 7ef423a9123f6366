#!/usr/bin/env bash
# scripts/gpu/packaging.sh: the GPU half of the packaging checks, on a CUDA machine with python3,
# torch, Triton, nvcc, cmake and nanobind and nothing to install; from the repository root.
#
#   1 wheel     pip install --no-build-isolation --no-deps --target $TARGET . (the default
#               bundle compiled here, or taken from build/bundle-cache), then `luminamoon doctor`
#               (its verdict must be OK for this GPU), `luminav verify --require-gpu` and
#               `luminav selftest` of the default bundle
#   2 aot       LuminaMoon(params, backend="aot") with no aot_bundle on CUDA, against
#               backend="triton" bit for bit
#   3 tests     the install, default-bundle and libtorch-adapter tests with the installed package
#               (test_torch_adapter.py builds examples/cpp_torch against the installed luminav and
#               the torch wheel's libtorch and runs it on CUDA beside Python's aot backend)
#   4 cold      benchmarks/cold_start.py on cuda:0
#
# Usage: scripts/gpu/packaging.sh [stage ...]   (default: wheel aot tests cold)
# Logs and results go to $OUT (default ./out); a .deps/ prefix (headers the system lacks) is used
# when present, as scripts/gpu/check.sh does (its packaging stage runs the aot and cold stages).
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
PY=${PY:-python3}
TARGET=${TARGET:-$PWD/build/pkg-target}
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}
export PYTHONPATH=$TARGET PATH=$TARGET/bin:$PATH
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(wheel aot tests cold)
status=0
declare -A result

defines=()
if [ -d .deps ]; then
  defines+=(--config-settings=cmake.define.CMAKE_PREFIX_PATH="$PWD/.deps"
            --config-settings=cmake.define.OPENSSL_ROOT_DIR="$PWD/.deps")
  export CMAKE_PREFIX_PATH=$PWD/.deps OPENSSL_ROOT_DIR=$PWD/.deps
fi

run_stage() {
  local name=$1; shift
  echo "=== $name ($(date +%T))"
  local t0=$SECONDS
  if "$@" > "$OUT/pkg-$name.log" 2>&1; then result[$name]="ok ($((SECONDS - t0)) s)"
  else result[$name]="FAILED ($((SECONDS - t0)) s)"; status=1; fi
  tail -n 30 "$OUT/pkg-$name.log"
}

s_wheel() {
  rm -rf "$TARGET"
  $PY -m pip install --no-build-isolation --no-deps --target "$TARGET" "${defines[@]}" . || return 1
  command -v luminav && luminav --version || return 1
  luminamoon doctor | tee "$OUT/doctor.txt"
  tail -n 1 "$OUT/doctor.txt" | grep -q "^verdict: OK: backend='aot' runs on cuda:0" || return 1
  local bundle; bundle=$(luminamoon aot default) || return 1
  luminav verify "$bundle" --require-gpu | tail -n 3 && luminav selftest "$bundle" | tail -n 5
}

s_aot() {
  $PY - <<'EOF'
import torch
from luminamoon import LuminaMoon
from luminamoon.optimizer.backends import get_backend

def run(backend):
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randn(s, generator=gen).cuda().requires_grad_() for s in ((6, 42), (123,), (4096,))]
    opt = LuminaMoon(ps, lr=3e-2, seed=11, state_dtype=torch.bfloat16, backend=backend)
    for _ in range(3):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen).cuda()
        opt.step()
    torch.cuda.synchronize()
    return [p.detach().cpu() for p in ps]

aot, jit = run("aot"), run("triton")
print("aot bundle:", get_backend("aot", "cuda").bundle_dir)
assert all(torch.equal(a, b) for a, b in zip(aot, jit)), "aot and triton differ"
print("backend='aot' with the default bundle equals backend='triton' bit for bit")
EOF
}

s_tests() {
  $PY -m pytest tests/test_default_bundle.py tests/test_cmake_install.py tests/test_torch_adapter.py \
    -q -ra -p no:cacheprovider --junitxml="$OUT/pytest-packaging.xml"
}

s_cold() {
  $PY benchmarks/cold_start.py --device cuda --repeats 5 --out-stem "$OUT/cold-start"
}

for s in "${stages[@]}"; do run_stage "$s" "s_$s"; done
echo "=== summary"
for s in "${stages[@]}"; do printf '%-6s %s\n' "$s" "${result[$s]}"; done
exit $status

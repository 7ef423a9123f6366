#!/usr/bin/env bash
# One GPU call that checks a kernel change end to end: builds the runtime and a bundle, runs
# the C++ tests, verifies and self-tests the bundle (GPU kernels against the C++ CPU engine) and
# the bundles of other Triton releases in .bundles/, then the GPU pytest suite. Logs under $OUT.
set -u
OUT=${OUT:-$PWD/out}; export OUT
JOBS=${JOBS:-$(nproc)} bash scripts/gpu/session.sh env build bundle ctest verify oldbundles pytest

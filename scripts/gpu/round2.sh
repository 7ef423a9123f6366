#!/usr/bin/env bash
# Kernel-change verification plus the old-Triton bundles (verify + selftest on the GPU).
set -u
OUT=${OUT:-$PWD/out}; export OUT
JOBS=${JOBS:-$(nproc)} bash scripts/gpu/session.sh env build bundle ctest verify oldbundles pytest

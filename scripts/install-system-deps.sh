#!/usr/bin/env bash
# Installs the system packages the native runtime builds against, where they are missing:
# nlohmann-json (manifest parsing), msgpack-cxx (the AMD code objects' metadata note, header-only),
# OpenSSL's libcrypto (SHA-256), GoogleTest, Ninja, and clang
# with its libFuzzer runtime for `make fuzz` (Debian 12: clang 14, libclang-rt-14-dev ships
# libclang_rt.fuzzer).
# With the argument "build": only what the wheel's own build needs (`make demo`); the tests'
# GoogleTest and the fuzzers' clang are left out. With "docs": Doxygen, which reads the C and C++
# headers for the documentation (`make docs`). With "screenshot": Chromium, to look at a rendered
# page headless (docs/README: `make docs-screenshot`).
set -euo pipefail
mode=${1:-all}
case "$mode" in all|build|docs|screenshot) ;; *) echo "usage: $0 [all|build|docs|screenshot]" >&2; exit 2 ;; esac
need=()
if [ "$mode" = docs ] || [ "$mode" = screenshot ]; then
  command -v doxygen >/dev/null 2>&1 || need+=(doxygen)
  [ "$mode" = screenshot ] && { command -v chromium >/dev/null 2>&1 || need+=(chromium); }
  mode=none
fi
if [ "$mode" != none ]; then
[ -f /usr/include/nlohmann/json.hpp ] || need+=(nlohmann-json3-dev)
[ -f /usr/include/openssl/evp.h ] || need+=(libssl-dev)
[ -f /usr/include/msgpack.hpp ] || need+=(libmsgpack-cxx-dev)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
fi
if [ "$mode" = all ]; then
  [ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
  command -v clang++ >/dev/null 2>&1 || need+=(clang)
  # -fsanitize=fuzzer links libclang_rt.fuzzer of the clang that compiles
  if ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 &&
     ! ls /usr/lib/clang/*/lib/*/libclang_rt.fuzzer*.a >/dev/null 2>&1; then
    if command -v clang++ >/dev/null 2>&1; then
      major=$(clang++ -dumpversion | cut -d. -f1)
    else
      major=$(apt-cache policy clang 2>/dev/null | sed -n 's/^ *Candidate: [0-9]*:\{0,1\}\([0-9]*\).*/\1/p')
    fi
    need+=("libclang-rt-${major:-14}-dev")
  fi
fi
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "missing system packages: ${need[*]}; install them with your package manager" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing system packages: ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null

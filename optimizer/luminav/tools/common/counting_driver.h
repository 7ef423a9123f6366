// tools/common/counting_driver.h: a counting copy of the CUDA driver table: every entry forwards
// to the real driver and counts its calls (luminav bench reports them per step)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "luminav/cuda_driver.h"

namespace luminav {
namespace tools {

// One index per symbol of LUMINAV_CUDA_DRIVER_SYMBOLS: k_cuLaunchKernel, k_cuMemAlloc, ...
enum DriverSymbol : std::size_t {
#define LUMINAV_COUNTING_SYMBOL(member, ...) k_##member,
  LUMINAV_CUDA_DRIVER_SYMBOLS(LUMINAV_COUNTING_SYMBOL)
#undef LUMINAV_COUNTING_SYMBOL
      kDriverSymbolCount
};

using CallCounts = std::array<std::uint64_t, kDriverSymbolCount>;

// Calls, between two snapshots, after which the host has waited for the device (or may have: an
// allocation, a free, a module load, a copy from or to pageable host memory). A step that makes
// none of these runs ahead of the device.
std::uint64_t blocking_calls(const CallCounts& before, const CallCounts& after);
// "cuMemAlloc x4, cuCtxSynchronize x4": those calls by name ("none" when there were none).
std::string describe_blocking(const CallCounts& before, const CallCounts& after);

// The table, installed with ScopedDriverOverride(&counting.table). One at a time: the forwarding
// functions find it through a process-wide pointer. It is used from the thread that runs the
// benchmark only (the engine calls the driver from the caller's thread), so the counters are
// plain integers.
struct CountingDriver {
  const CudaDriverApi* real = nullptr;
  CudaDriverApi table;
  CallCounts counts{};

  explicit CountingDriver(const CudaDriverApi& driver);
  ~CountingDriver();
  CountingDriver(const CountingDriver&) = delete;
  CountingDriver& operator=(const CountingDriver&) = delete;
};

}  // namespace tools
}  // namespace luminav

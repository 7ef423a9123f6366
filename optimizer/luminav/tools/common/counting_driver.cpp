// tools/common/counting_driver.cpp: the counting copy of the CUDA driver table (see
// counting_driver.h)
#include "common/counting_driver.h"

namespace luminav {
namespace tools {

namespace {

constexpr const char* kDriverSymbolNames[] = {
#define LUMINAV_COUNTING_NAME(member, ...) #member,
    LUMINAV_CUDA_DRIVER_SYMBOLS(LUMINAV_COUNTING_NAME)
#undef LUMINAV_COUNTING_NAME
};

constexpr DriverSymbol kBlockingCalls[] = {
    k_cuCtxSynchronize, k_cuStreamSynchronize, k_cuEventSynchronize, k_cuMemcpyHtoD,   k_cuMemcpyDtoH,
    k_cuMemcpyHtoDAsync, k_cuMemcpyDtoHAsync, k_cuMemAlloc,          k_cuMemFree,      k_cuModuleLoadData,
    k_cuModuleUnload,   k_cuStreamCreate,     k_cuStreamDestroy,     k_cuGraphInstantiateWithFlags};

CountingDriver* g_counting = nullptr;

template <class F>
struct Forward;
template <class... A>
struct Forward<CUresult (*)(A...)> {
  template <std::size_t I, CUresult (*CudaDriverApi::*M)(A...)>
  static CUresult call(A... a) {
    ++g_counting->counts[I];
    return (g_counting->real->*M)(a...);
  }
};

}  // namespace

std::uint64_t blocking_calls(const CallCounts& before, const CallCounts& after) {
  std::uint64_t n = 0;
  for (DriverSymbol s : kBlockingCalls) n += after[s] - before[s];
  return n;
}

std::string describe_blocking(const CallCounts& before, const CallCounts& after) {
  std::string out;
  for (DriverSymbol s : kBlockingCalls) {
    const std::uint64_t n = after[s] - before[s];
    if (n == 0) continue;
    if (!out.empty()) out += ", ";
    out += std::string(kDriverSymbolNames[s]) + " x" + std::to_string(n);
  }
  return out.empty() ? "none" : out;
}

CountingDriver::CountingDriver(const CudaDriverApi& driver) : real(&driver), table(driver) {
#define LUMINAV_COUNTING_FORWARD(member, ...)                                                               \
  if (driver.member != nullptr) {                                                                        \
    table.member = &Forward<decltype(CudaDriverApi::member)>::template call<k_##member, &CudaDriverApi::member>; \
  }
  LUMINAV_CUDA_DRIVER_SYMBOLS(LUMINAV_COUNTING_FORWARD)
#undef LUMINAV_COUNTING_FORWARD
  table.origin = driver.origin + " (calls counted by luminav bench)";
  g_counting = this;
}

CountingDriver::~CountingDriver() { g_counting = nullptr; }

}  // namespace tools
}  // namespace luminav

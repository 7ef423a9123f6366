// tools/common/cuda_session.cpp: a device's primary context and buffers for the luminav
// subcommands (see cuda_session.h)
#include "common/cuda_session.h"

namespace luminav {
namespace tools {

CudaSession::CudaSession(const CudaDriverApi& api, int ordinal, const std::string& where, bool timing) : api_(api) {
  try {
    check(api_, api_.cuDeviceGet(&device_, ordinal), "cuDeviceGet", where);
    check(api_, api_.cuDevicePrimaryCtxRetain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
    retained_ = true;
    check(api_, api_.cuCtxPushCurrent(ctx_), "cuCtxPushCurrent");
    pushed_ = true;
    if (timing) {
      check(api_, api_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      check(api_, api_.cuEventCreate(&start_, CU_EVENT_DEFAULT), "cuEventCreate");
      check(api_, api_.cuEventCreate(&stop_, CU_EVENT_DEFAULT), "cuEventCreate");
    }
  } catch (...) {
    release();  // no destructor runs for a constructor that throws
    throw;
  }
}

CudaSession::~CudaSession() { release(); }

void CudaSession::release() noexcept {
  if (pushed_) api_.cuCtxSynchronize();
  for (CUdeviceptr p : buffers_) api_.cuMemFree(p);
  if (start_) api_.cuEventDestroy(start_);
  if (stop_) api_.cuEventDestroy(stop_);
  if (stream_) api_.cuStreamDestroy(stream_);
  if (pushed_) {
    CUcontext popped = nullptr;
    api_.cuCtxPopCurrent(&popped);
  }
  if (retained_) api_.cuDevicePrimaryCtxRelease(device_);
  buffers_.clear();
  start_ = stop_ = nullptr;
  stream_ = nullptr;
  pushed_ = retained_ = false;
}

CUdeviceptr CudaSession::alloc(std::size_t bytes, const std::string& what) {
  CUdeviceptr p = 0;
  check(api_, api_.cuMemAlloc(&p, bytes), "cuMemAlloc", what);
  buffers_.push_back(p);
  return p;
}

void CudaSession::write(CUdeviceptr dst, const void* src, std::size_t bytes) {
  if (bytes > 0) check(api_, api_.cuMemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD");
}

void CudaSession::read(void* dst, CUdeviceptr src, std::size_t bytes, const char* waiting_for) {
  check(api_, api_.cuCtxSynchronize(), "cuCtxSynchronize", waiting_for);
  if (bytes > 0) check(api_, api_.cuMemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH");
}

}  // namespace tools
}  // namespace luminav

// tools/common/cuda_session.h: the one CUDA session of the luminav subcommands: a device's
// primary context, current while the object lives, and device buffers in it
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "luminav/cuda_driver.h"

namespace luminav {
namespace tools {

// Retains device `ordinal`'s primary context and makes it current; with `timing`, also makes a
// non-blocking stream and two events (bench). Everything is released in the destructor, whatever
// step failed (buffers freed after the device is synchronised). `where` names the session in
// the message of a failed cuDeviceGet. Throws Error(kDriverError) naming the failed call.
class CudaSession {
 public:
  CudaSession(const CudaDriverApi& api, int ordinal, const std::string& where, bool timing);
  ~CudaSession();
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;

  // `bytes` (> 0) of device memory, freed with the session; `what` goes into the message of a
  // failed cuMemAlloc.
  CUdeviceptr alloc(std::size_t bytes, const std::string& what);
  // Synchronous copies; read first waits for the device (`waiting_for` names that wait in the
  // message of a failure).
  void write(CUdeviceptr dst, const void* src, std::size_t bytes);
  void read(void* dst, CUdeviceptr src, std::size_t bytes, const char* waiting_for);

  const CudaDriverApi& api() const { return api_; }
  CUdevice device() const { return device_; }
  CUstream stream() const { return stream_; }
  CUevent start() const { return start_; }
  CUevent stop() const { return stop_; }

 private:
  void release() noexcept;

  const CudaDriverApi& api_;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  bool retained_ = false, pushed_ = false;
  CUstream stream_ = nullptr;
  CUevent start_ = nullptr, stop_ = nullptr;
  std::vector<CUdeviceptr> buffers_;
};

}  // namespace tools
}  // namespace luminav

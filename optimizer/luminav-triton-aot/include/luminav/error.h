// include/luminav/error.h: luminav::Error, the exception thrown inside the library (and by the
// C++ API, luminav.hpp), with its status
//
// The C API converts it to a status code and a thread-local last-error string in one place
// (luminav/src/c_api.cpp). It lives in luminav-triton-aot, the lower component, which throws it
// too.
#pragma once

#include <stdexcept>
#include <string>

// The C++ symbols libluminav exports besides the C API (everything else in it is hidden):
// luminav::Error and the driver table of cuda_driver.h, which programs linking the installed
// library call.
#ifndef LUMINAV_CXX_API
#define LUMINAV_CXX_API __attribute__((visibility("default")))
#endif

namespace luminav {

// Status codes shared by the C API (luminav.h mirrors these values as LV_STATUS_*).
enum class Status : int {
  kOk = 0,
  kInvalidArgument = 1,   // a user value is out of range, null, or inconsistent
  kBundleError = 2,       // the bundle (manifest or cubin) is missing, corrupt or incompatible
  kDriverError = 3,       // the CUDA driver is missing or a driver call failed
  kNotFound = 4,          // a requested kernel variant, device or file does not exist
  kStateError = 5,        // an object was used in a state that does not allow the call
  kNonFinite = 6,         // nonfinite="raise" met a non-finite gradient
  kInternal = 7,          // a broken invariant inside the library
};

class LUMINAV_CXX_API Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

}  // namespace luminav

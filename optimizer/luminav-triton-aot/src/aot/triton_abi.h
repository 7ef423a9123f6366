// src/aot/triton_abi.h: how a Triton-compiled kernel takes its arguments (type words and their
// sizes, the kernelParams array with its trailing scratch pointers, scratch sizes)
//
// The facts are in docs/triton-abi.md. The manifest (aot/manifest.h) describes each kernel with
// these words and counts; the runtime (aot/runtime.h) packs every launch with
// pack_triton_abi_args, the function the GoogleTest test_triton3_abi_trailing_scratch_pointer
// checks. ArgType lives here rather than in manifest.h because it is Triton's ABI (what
// cuLaunchKernel reads for a type word), which the manifest only records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "luminav/cuda_driver.h"

namespace luminav {

// One argument type of a kernel signature, parsed from a Triton type word ("*fp32", "i64"...).
struct ArgType {
  std::string word;       // as written in the manifest
  bool pointer = false;   // "*<word>" or "*k<word>": passed as an 8-byte CUdeviceptr
  std::string element;    // the word without "*"/"*k"
  std::size_t size = 0;   // bytes of the value cuLaunchKernel reads for it

  // Throws Error(kBundleError) naming the word for one Triton does not pass as a plain value
  // (tensor descriptors, unknown words).
  static ArgType parse(const std::string& word);
};

// The zero CUdeviceptr that every unused trailing scratch parameter of a Triton kernel points at.
extern const CUdeviceptr TRITON_NULL_SCRATCH;

// The kernelParams array for cuLaunchKernel of a Triton-compiled kernel: the user argument
// pointers, unchanged and in order, then `num_trailing_scratch_ptrs` (0, 1 or 2) pointers for
// the implicit trailing parameters Triton adds (global_scratch, then profile_scratch): each
// points at TRITON_NULL_SCRATCH. Throws Error(kInvalidArgument) for another count or a null
// user argument pointer.
std::vector<void*> pack_triton_abi_args(const std::vector<void*>& user_arg_ptrs, int num_trailing_scratch_ptrs);

// The same, with scratch buffers: `global_scratch` / `profile_scratch` point at a CUdeviceptr
// holding the buffer's device address (null: TRITON_NULL_SCRATCH). The pointed-to values must
// stay alive until cuLaunchKernel returns. A non-null profile_scratch needs 2 trailing
// pointers, a non-null global_scratch at least 1.
std::vector<void*> pack_triton_abi_args(const std::vector<void*>& user_arg_ptrs, int num_trailing_scratch_ptrs,
                                        const CUdeviceptr* global_scratch, const CUdeviceptr* profile_scratch);

// The same into storage the caller owns, without a host allocation (the runtime's launch path):
// writes count + num_trailing_scratch_ptrs entries to `out`, which holds `capacity`, and
// returns that number. Throws as above, and Error(kInternal) when `capacity` is too small.
std::size_t pack_triton_abi_args(void* const* user_arg_ptrs, std::size_t count, int num_trailing_scratch_ptrs,
                                 const CUdeviceptr* global_scratch, const CUdeviceptr* profile_scratch, void** out,
                                 std::size_t capacity);

// Throws Error(kInvalidArgument) naming the first null entry of `user_arg_ptrs`.
void check_user_arg_ptrs(const void* const* user_arg_ptrs, std::size_t count);

// Bytes of global (or profile) scratch a launch of grid (x, y, z) needs: x·y·z·num_ctas·size;
// 0 when `size` <= 0. Throws Error(kInvalidArgument) naming `what` and the grid on overflow.
std::size_t triton_scratch_bytes(std::int64_t size, int num_ctas, unsigned x, unsigned y, unsigned z,
                                 const char* what);

}  // namespace luminav

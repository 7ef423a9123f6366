// src/aot/triton_abi.cpp: Triton's type words and their sizes, the kernelParams packer with its
// trailing scratch pointers, and scratch sizing (docs/triton-abi.md)
#include "aot/triton_abi.h"

#include <limits>
#include <string>
#include <utility>

#include "luminav/error.h"

namespace luminav {

ArgType ArgType::parse(const std::string& word) {
  ArgType t;
  t.word = word;
  std::string elem = word;
  if (!elem.empty() && elem[0] == '*') {
    t.pointer = true;
    elem = elem.substr(1);
    // "*k<word>" marks a pointer Triton treats as constant; the ABI is the same.
    if (elem.size() > 1 && elem[0] == 'k' && elem != "k") elem = elem.substr(1);
  }
  t.element = elem;
  // Value sizes as Triton's launcher (backends/nvidia/driver.py: ty_to_cpp, FLOAT_STORAGE_TYPE)
  // passes them.
  static const std::pair<const char*, std::size_t> kScalars[] = {
      {"i1", 1}, {"i8", 1}, {"i16", 2}, {"i32", 4}, {"i64", 8}, {"u1", 1}, {"u8", 1}, {"u16", 2}, {"u32", 4},
      {"u64", 8}, {"fp16", 2}, {"bf16", 2}, {"fp32", 4}, {"f32", 4}, {"fp64", 8}};
  static const char* const kPointeeOnly[] = {"fp8e4nv", "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16", "void"};
  std::size_t size = 0;
  for (const auto& s : kScalars) {
    if (elem == s.first) size = s.second;
  }
  bool pointee_ok = size != 0;
  if (t.pointer) {
    for (const char* p : kPointeeOnly) pointee_ok = pointee_ok || elem == p;
  }
  if (!pointee_ok) {
    throw Error(Status::kBundleError, "unknown Triton type word \"" + word + "\"");
  }
  t.size = t.pointer ? sizeof(CUdeviceptr) : size;
  return t;
}

const CUdeviceptr TRITON_NULL_SCRATCH = 0;

void check_user_arg_ptrs(const void* const* user_arg_ptrs, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    if (user_arg_ptrs[i] == nullptr) {
      throw Error(Status::kInvalidArgument, "kernel argument " + std::to_string(i) +
                                                " is a null pointer; each entry must point at the argument's value");
    }
  }
}

std::size_t pack_triton_abi_args(void* const* user_arg_ptrs, std::size_t count, int num_trailing_scratch_ptrs,
                                 const CUdeviceptr* global_scratch, const CUdeviceptr* profile_scratch, void** out,
                                 std::size_t capacity) {
  if (num_trailing_scratch_ptrs < 0 || num_trailing_scratch_ptrs > 2) {
    throw Error(Status::kInvalidArgument,
                "num_trailing_scratch_ptrs must be 0 (Triton 3.0-3.2), 1 (3.3-3.4) or 2 (3.5+), got " +
                    std::to_string(num_trailing_scratch_ptrs) + "; rebuild the bundle with a supported Triton");
  }
  if (global_scratch != nullptr && num_trailing_scratch_ptrs < 1) {
    throw Error(Status::kInvalidArgument,
                "a global scratch buffer was given but the kernel has no trailing scratch parameter "
                "(num_trailing_scratch_ptrs = 0)");
  }
  if (profile_scratch != nullptr && num_trailing_scratch_ptrs < 2) {
    throw Error(Status::kInvalidArgument,
                "a profile scratch buffer was given but the kernel has " + std::to_string(num_trailing_scratch_ptrs) +
                    " trailing scratch parameter(s); profile scratch is the second");
  }
  check_user_arg_ptrs(user_arg_ptrs, count);
  const std::size_t n = count + static_cast<std::size_t>(num_trailing_scratch_ptrs);
  if (n > capacity) {
    throw Error(Status::kInternal, "pack_triton_abi_args: " + std::to_string(n) + " kernelParams entries for room of " +
                                       std::to_string(capacity));
  }
  for (std::size_t i = 0; i < count; ++i) out[i] = user_arg_ptrs[i];
  // kernelParams is void**: the driver only reads through these, so pointing at the const zero
  // (or at the caller's const scratch address) is sound.
  auto slot = [](const CUdeviceptr* p) {
    return const_cast<void*>(static_cast<const void*>(p != nullptr ? p : &TRITON_NULL_SCRATCH));
  };
  if (num_trailing_scratch_ptrs >= 1) out[count] = slot(global_scratch);
  if (num_trailing_scratch_ptrs >= 2) out[count + 1] = slot(profile_scratch);
  return n;
}

std::vector<void*> pack_triton_abi_args(const std::vector<void*>& user_arg_ptrs, int num_trailing_scratch_ptrs) {
  return pack_triton_abi_args(user_arg_ptrs, num_trailing_scratch_ptrs, nullptr, nullptr);
}

std::vector<void*> pack_triton_abi_args(const std::vector<void*>& user_arg_ptrs, int num_trailing_scratch_ptrs,
                                        const CUdeviceptr* global_scratch, const CUdeviceptr* profile_scratch) {
  std::vector<void*> params(user_arg_ptrs.size() + 2);  // room for the most trailing pointers
  params.resize(pack_triton_abi_args(user_arg_ptrs.data(), user_arg_ptrs.size(), num_trailing_scratch_ptrs,
                                     global_scratch, profile_scratch, params.data(), params.size()));
  return params;
}

std::size_t triton_scratch_bytes(std::int64_t size, int num_ctas, unsigned x, unsigned y, unsigned z,
                                 const char* what) {
  if (size <= 0) return 0;
  // Multiply with an overflow check at each factor.
  const std::uint64_t limit = std::numeric_limits<std::size_t>::max() / 2;
  std::uint64_t total = 1;
  bool overflow = false;
  for (const std::uint64_t f : {std::uint64_t{x}, std::uint64_t{y}, std::uint64_t{z},
                                static_cast<std::uint64_t>(num_ctas), static_cast<std::uint64_t>(size)}) {
    if (f != 0 && total > limit / f) overflow = true;
    total *= f;
  }
  if (overflow) {
    throw Error(Status::kInvalidArgument, std::string(what) + " for grid (" + std::to_string(x) + ", " +
                                              std::to_string(y) + ", " + std::to_string(z) + ") overflows");
  }
  return static_cast<std::size_t>(total);
}

}  // namespace luminav

// tests/test_triton_abi.cpp: Triton 3.x's kernel ABI (src/aot/triton_abi.cpp): the kernelParams
// array (user arguments, then 0, 1 or 2 implicit trailing scratch pointers), argument type
// sizes, and scratch sizing
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "aot/manifest.h"
#include "aot/triton_abi.h"
#include "fakes/expect_error.h"
#include "luminav/error.h"

using luminav::CUdeviceptr;
using luminav::Status;
using luminav::TRITON_NULL_SCRATCH;
using luminav::pack_triton_abi_args;
using namespace luminav_test;

TEST(TritonAbi, test_triton3_abi_trailing_scratch_pointer) {
  // Values of a pass-1-like argument list: three pointers, an i64 and an fp32.
  CUdeviceptr table = 0x7000, block_map = 0x8000, partial = 0x9000;
  std::int64_t seed = 42;
  float beta1 = 0.9f;
  const std::vector<void*> user = {&table, &block_map, &partial, &seed, &beta1};

  for (int trailing = 0; trailing <= 2; ++trailing) {
    SCOPED_TRACE(trailing);
    const std::vector<void*> params = pack_triton_abi_args(user, trailing);
    ASSERT_EQ(params.size(), user.size() + static_cast<std::size_t>(trailing));
    for (std::size_t i = 0; i < user.size(); ++i) EXPECT_EQ(params[i], user[i]) << "user argument " << i;
    for (int t = 0; t < trailing; ++t) {
      const void* p = params[user.size() + static_cast<std::size_t>(t)];
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(p, static_cast<const void*>(&TRITON_NULL_SCRATCH));
      EXPECT_EQ(*static_cast<const CUdeviceptr*>(p), 0u);
    }
  }
  // The user values are read through the packed pointers unchanged.
  const std::vector<void*> params = pack_triton_abi_args(user, 2);
  EXPECT_EQ(*static_cast<CUdeviceptr*>(params[1]), 0x8000u);
  EXPECT_EQ(*static_cast<std::int64_t*>(params[3]), 42);
  EXPECT_EQ(*static_cast<float*>(params[4]), 0.9f);

  // With scratch buffers: each trailing entry points at the given address.
  const CUdeviceptr global = 0xA000, profile = 0xB000;
  const std::vector<void*> one = pack_triton_abi_args(user, 1, &global, nullptr);
  ASSERT_EQ(one.size(), 6u);
  EXPECT_EQ(one[5], static_cast<const void*>(&global));
  EXPECT_EQ(*static_cast<const CUdeviceptr*>(one[5]), 0xA000u);
  const std::vector<void*> two = pack_triton_abi_args(user, 2, &global, &profile);
  ASSERT_EQ(two.size(), 7u);
  for (std::size_t i = 0; i < user.size(); ++i) EXPECT_EQ(two[i], user[i]);
  EXPECT_EQ(*static_cast<const CUdeviceptr*>(two[5]), 0xA000u);
  EXPECT_EQ(*static_cast<const CUdeviceptr*>(two[6]), 0xB000u);
  const std::vector<void*> profile_only = pack_triton_abi_args(user, 2, nullptr, &profile);
  EXPECT_EQ(*static_cast<const CUdeviceptr*>(profile_only[5]), 0u);
  EXPECT_EQ(*static_cast<const CUdeviceptr*>(profile_only[6]), 0xB000u);

  // A kernel without user arguments still gets its trailing pointers.
  const std::vector<void*> none = pack_triton_abi_args({}, 2);
  ASSERT_EQ(none.size(), 2u);
  EXPECT_EQ(*static_cast<const CUdeviceptr*>(none[0]), 0u);
}

TEST(TritonAbi, TheCallerStoragePackerWritesWhatTheVectorPackerReturns) {
  CUdeviceptr table = 0x7000;
  std::int32_t n = 3;
  void* user[] = {&table, &n};
  const CUdeviceptr global = 0xA000;
  for (int trailing = 0; trailing <= 2; ++trailing) {
    SCOPED_TRACE(trailing);
    void* out[4] = {nullptr, nullptr, nullptr, nullptr};
    const CUdeviceptr* g = trailing >= 1 ? &global : nullptr;
    const std::size_t written = pack_triton_abi_args(user, 2, trailing, g, nullptr, out, 4);
    const std::vector<void*> expected = pack_triton_abi_args({user[0], user[1]}, trailing, g, nullptr);
    ASSERT_EQ(written, expected.size());
    for (std::size_t i = 0; i < written; ++i) EXPECT_EQ(out[i], expected[i]) << "entry " << i;
  }
  void* small[2];
  expect_error([&] { pack_triton_abi_args(user, 2, 1, nullptr, nullptr, small, 2); }, Status::kInternal,
               {"3 kernelParams entries for room of 2"});
}

TEST(TritonAbi, RefusesOtherTrailingCountsAndNullArguments) {
  CUdeviceptr a = 1;
  for (const int bad : {-1, 3, 7}) {
    expect_error([&] { pack_triton_abi_args({&a}, bad); }, Status::kInvalidArgument,
                 {"num_trailing_scratch_ptrs must be 0", "got " + std::to_string(bad)});
  }
  expect_error([&] { pack_triton_abi_args({&a, nullptr}, 2); }, Status::kInvalidArgument,
               {"kernel argument 1 is a null pointer"});
  const CUdeviceptr g = 0x1000;
  expect_error([&] { pack_triton_abi_args({&a}, 0, &g, nullptr); }, Status::kInvalidArgument,
               {"no trailing scratch parameter"});
  expect_error([&] { pack_triton_abi_args({&a}, 1, nullptr, &g); }, Status::kInvalidArgument,
               {"profile scratch is the second"});
}

TEST(TritonAbi, ArgTypeSizesFollowTritonsLauncher) {
  struct Case {
    const char* word;
    bool pointer;
    std::size_t size;
  };
  for (const Case c : {Case{"*fp32", true, 8}, Case{"*kbf16", true, 8}, Case{"*i64", true, 8},
                       Case{"*fp8e4nv", true, 8}, Case{"i1", false, 1}, Case{"i8", false, 1},
                       Case{"i16", false, 2}, Case{"i32", false, 4}, Case{"u32", false, 4},
                       Case{"i64", false, 8}, Case{"u64", false, 8}, Case{"fp16", false, 2},
                       Case{"bf16", false, 2}, Case{"fp32", false, 4}, Case{"fp64", false, 8}}) {
    SCOPED_TRACE(c.word);
    const luminav::ArgType t = luminav::ArgType::parse(c.word);
    EXPECT_EQ(t.pointer, c.pointer);
    EXPECT_EQ(t.size, c.size);
  }
  for (const char* bad : {"", "*", "f32x", "nvTmaDesc", "tensordesc<fp32[16]>", "fp8e5", "*k", "i128"}) {
    SCOPED_TRACE(bad);
    expect_error([&] { luminav::ArgType::parse(bad); }, Status::kBundleError, {"unknown Triton type word"});
  }
}

TEST(TritonAbi, ScratchBytesScaleWithTheGrid) {
  luminav::KernelMetadata m;
  m.num_ctas = 1;
  m.global_scratch_size = 0;
  EXPECT_EQ(m.global_scratch_bytes(1000, 1, 1), 0u);
  m.global_scratch_size = 96;
  EXPECT_EQ(m.global_scratch_bytes(1000, 2, 3), 1000u * 2 * 3 * 96);
  m.num_ctas = 2;
  EXPECT_EQ(m.global_scratch_bytes(5, 1, 1), 5u * 2 * 96);
  m.profile_scratch_size = 16;
  EXPECT_EQ(m.profile_scratch_bytes(7, 1, 1), 7u * 2 * 16);
  m.global_scratch_size = std::int64_t{1} << 40;
  expect_error([&] { m.global_scratch_bytes(4294967295u, 65535u, 65535u); }, Status::kInvalidArgument,
               {"global scratch", "overflows"});
}

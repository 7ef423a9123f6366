// tests/fakes/fake_driver.h: a fake CUDA driver table that records what the runtime asks of it
// (launches with their kernelParams, loads, allocations, contexts), for machines without a GPU
//
// It stands in for the driver only to reach error paths and observe launches; nothing in it
// computes a kernel. Its functions are plain C-style functions (the table holds raw function
// pointers), so they share one global state, fake(); FakeDriverFixture resets it for every test.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "luminav/cuda_driver.h"

namespace luminav_test {

struct LaunchRecord {
  luminav::CUfunction function;
  unsigned grid[3];
  unsigned block[3];
  unsigned shared;
  luminav::CUstream stream;
  std::vector<void*> params;                  // kernelParams as passed (the first n_expected)
  std::vector<luminav::CUdeviceptr> trailing;  // the values the trailing entries point at
  luminav::CUcontext current;                  // context current during the launch
};

// What the fake answers and what it saw; FakeDriverFixture restores these defaults per test.
struct FakeValues {
  int device_count = 1;
  int cc_major = 9, cc_minor = 0;
  int shared_optin = 232448;  // an H100/H200's opt-in limit
  luminav::CUresult module_load_result = luminav::CUDA_SUCCESS;
  luminav::CUresult launch_result = luminav::CUDA_SUCCESS;
  std::vector<std::string> entries = {"_lumina_tdclm_pass2_kernel"};
  std::vector<std::size_t> param_sizes;  // cuFuncGetParamInfo answers; empty: 15 as pass 2 has
  bool use_param_sizes = false;
  int max_threads = 1024;
  int module_loads = 0, module_unloads = 0;
  int retains = 0, releases = 0;
  std::vector<const void*> loaded_images;
  std::vector<std::pair<int, int>> func_set_attributes;
  std::vector<std::size_t> allocations;
  std::vector<luminav::CUdeviceptr> freed;
  luminav::CUdeviceptr next_address = 0x7f0000000100ull;  // 256-aligned, not 512-aligned
  std::vector<luminav::CUcontext> ctx_stack;  // top = current
  int ctx_queries = 0, ctx_pushes = 0;         // cuCtxGetCurrent, cuCtxPushCurrent calls
  std::vector<LaunchRecord> launches;
  std::size_t n_user_args = 13;  // how many kernelParams entries are user arguments
  int n_trailing = 2;
};

struct FakeState : FakeValues {
  std::mutex mu;
};

FakeState& fake();
// Restores every FakeValues field of fake() to its default.
void reset_fake();

// The handles the fake hands out: device `device`'s primary context, a context of "another
// library", and the function of FakeValues::entries[i].
luminav::CUcontext fake_primary_ctx(int device);
luminav::CUcontext fake_user_ctx();
luminav::CUfunction fake_function(std::size_t i);

// The table: every entry the AOT runtime calls; the rest stay null.
luminav::CudaDriverApi make_fake_driver();

// Resets the fake's state, installs the table for the test's duration.
class FakeDriverFixture : public ::testing::Test {
 protected:
  void SetUp() override { reset_fake(); }

  luminav::CudaDriverApi api_ = make_fake_driver();
  luminav::ScopedDriverOverride override_{&api_};
};

}  // namespace luminav_test

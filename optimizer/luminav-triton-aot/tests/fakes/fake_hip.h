// tests/fakes/fake_hip.h: a fake HIP runtime table that records what the HIP runtime of luminav
// asks of it (module loads, function lookups, launches with their parameters, allocations), and
// can be told to fail any of them, for machines without an AMD GPU
//
// Nothing in it runs a kernel. Like the fake CUDA driver its functions share one global state,
// fake_hip(); FakeHipFixture resets it and installs the table for every test.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "aot/hip_driver.h"

namespace luminav_test {

struct HipLaunchRecord {
  std::string function;  // the name hipModuleGetFunction was given
  unsigned grid[3];
  unsigned block[3];
  unsigned shared;
  luminav::hipStream_t stream;
  int device;                                  // current device during the launch
  std::vector<void*> params;                   // the user arguments' entries as passed
  std::vector<unsigned long long> trailing;    // the values the trailing entries point at
  bool extra_null;                             // the `extra` argument was null
};

struct FakeHipValues {
  int device_count = 1;
  int current_device = 0;
  int max_threads = 1024;
  luminav::hipError_t module_load_result = luminav::hipSuccess;
  luminav::hipError_t launch_result = luminav::hipSuccess;
  luminav::hipError_t malloc_result = luminav::hipSuccess;
  std::set<std::string> missing_functions;  // hipModuleGetFunction answers hipErrorNotFound
  // kernel name -> (user arguments, trailing pointers) the launch record splits its params into
  std::map<std::string, std::pair<std::size_t, int>> param_counts;
  // hipMalloc hands out host memory (aligned to 256 bytes) that hipMemcpy*, hipMemset* and
  // hipFree act on, so the engine's device tables can be read back; off: fake addresses that
  // nothing may touch.
  bool host_memory = false;
  luminav::hipError_t memcpy_result = luminav::hipSuccess;  // hipMemcpy and hipMemcpyAsync
  int module_loads = 0, module_unloads = 0, set_device_calls = 0, device_syncs = 0, memsets = 0;
  std::vector<const void*> loaded_images;
  std::vector<std::string> looked_up;
  std::vector<std::size_t> allocations;
  std::vector<void*> freed;
  unsigned long long next_address = 0x7e0000000100ull;
  std::vector<HipLaunchRecord> launches;
  // Called for every launch that succeeds, with its record and kernel parameters (with
  // host_memory, a test plays the kernel's part here, e.g. raising a flag).
  std::function<void(const HipLaunchRecord&, void** params)> on_launch;
};

struct FakeHipState : FakeHipValues {
  std::mutex mu;
};

FakeHipState& fake_hip();
void reset_fake_hip();

// The table: every hip* entry luminav calls.
luminav::HipApi make_fake_hip();

class FakeHipFixture : public ::testing::Test {
 protected:
  void SetUp() override { reset_fake_hip(); }

  luminav::HipApi api_ = make_fake_hip();
  luminav::ScopedHipOverride override_{&api_};
};

}  // namespace luminav_test

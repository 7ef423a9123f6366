// tests/fakes/fake_cuda_device.h: a fake CUDA device for the engine's CUDA path and AotGroup:
// the fake driver table (fake_driver.h) with "device memory" that is host memory, launches
// decoded per kernel, memsets, stream capture and graph replay recorded in order
//
// The fake computes no update; it does what a step's bookkeeping needs: its reduce raises the
// flag it is given when a test says the gradients are not finite (FakeDevice::bad_grads), and
// its commit advances every table row's STEP by 1 - found_inf. Update results are checked on a
// GPU (`luminav selftest`, the GPU tests of tests/).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "fakes/fake_bundle.h"
#include "fakes/fake_driver.h"
#include "luminav/cuda_driver.h"

namespace luminav_test {

// The kernels in the order of FakeState::entries: fake_function(i) is kKinds[i]'s. The bundles
// of these tests name the commit without CHECK_FLAG by an entry of its own (kCommitF0Entry), so
// that the fake's commit knows whether to read found_inf; its kind is "commit" too.
extern const char* const kKinds[6];
constexpr std::size_t kCommitF0 = 5;
constexpr const char* kCommitF0Entry = "_lumina_tdclm_commit_kernel_nocheck";

struct Launch {
  std::string kind;
  unsigned grid;
  luminav::CUstream stream;
  std::vector<std::uint64_t> args;  // each user argument's value, zero-extended
  bool replayed = false;            // run by cuGraphLaunch (not by cuLaunchKernel)
  std::uint32_t lr_bits = 0;        // pass 2 / single pass: the lr in device memory when it ran
  bool reads_flag = true;           // commit: CHECK_FLAG = 1
};

struct Memset {
  luminav::CUdeviceptr at;
  unsigned value;
  std::size_t count;  // 32-bit words
};

// The device side of the fake: memory is host memory, launches and memsets are recorded.
// Work recorded by stream capture: a launch or a 32-bit memset.
struct Op {
  bool is_launch;
  Launch launch;
  Memset memset;
};

struct FakeDevice {
  std::vector<Launch> launches;
  std::vector<Memset> memsets32;  // on a stream (a graph's memsets are in graph_memsets)
  int allocs = 0, frees = 0, syncs = 0, htod = 0, dtoh = 0, dtod = 0;
  std::map<luminav::CUstream, luminav::CUstreamCaptureStatus> capturing;
  bool bad_grads = false;  // the reduce raises its flag: the step saw a non-finite gradient
  // Graphs: streams being captured (cuStreamBeginCapture), graphs and executable graphs by handle.
  std::map<luminav::CUstream, std::vector<Op>> recording;
  std::map<std::uintptr_t, std::vector<Op>> graphs, execs;
  std::vector<luminav::CUstreamCaptureMode> capture_modes;
  std::vector<Memset> graph_memsets;
  std::uintptr_t next_handle = 0x1000;
  int streams_created = 0, streams_destroyed = 0, instantiations = 0, graph_launches = 0;
};

// The fake device's record; CudaDeviceTest starts each test with a fresh one.
FakeDevice& dev();

// The driver entries of the fake device (installed by CudaDeviceTest); tests reinstall some.
namespace fake_mem {
void* at(luminav::CUdeviceptr p);  // the host memory behind a fake device address
luminav::CUresult graph_launch(luminav::CUgraphExec e, luminav::CUstream stream);
}  // namespace fake_mem

// Argument positions (docs/internals.md "Kernels"), written here independently of the engine's.
constexpr std::size_t kTable = 0;
constexpr std::size_t kPass1Seed = 4;
constexpr std::size_t kReduceFlag = 4, kReduceCount = 5;
constexpr std::size_t kPass2Flag = 3, kPass2Lr = 4, kPass2Seed = 5;
constexpr std::size_t kCommitFlag = 1, kCommitCount = 2;

// Host allocations (operator new) of the whole program so far. Defined by counting_new.cpp,
// which replaces the program's allocator: only the test binaries that count allocations link it.
long long host_allocations();

// A group that runs pass 1 and skips steps on non-finite gradients (clip 4).
luminav::Hyper clip_skip();

// The fake device installed over the fake driver, the primary context current (as in a program
// that uses the engine), a bundle folder, and host tensors standing in for device tensors.
class CudaDeviceTest : public FakeDriverFixture {
 protected:
  void SetUp() override;

  // A bundle with every variant the given groups run (sm_90).
  void write_bundle(const std::vector<luminav::GroupConfig>& cfgs);
  std::string cubin_of(const std::string& key) const { return dir_.file(key + ".sm90.cubin"); }
  static luminav::GroupConfig config(const luminav::Hyper& h);
  // The capture and graph calls of the table (left out, steps stay eager).
  void install_graphs();
  std::unique_ptr<luminav::Engine> engine(std::uint64_t seed = 7, bool cuda_graph = true);
  // Tensors of `numels` elements (fp32, host memory standing in for device memory).
  std::size_t add_group(luminav::Engine& e, const luminav::Hyper& h, const std::vector<std::int64_t>& numels);
  // The first `rows` rows of the table a launch read.
  static std::vector<std::int64_t> table(const Launch& l, std::size_t rows);
  static std::vector<std::string> kinds(const std::vector<Launch>& ls);

  TempDir dir_;
  std::list<std::vector<float>> params_, grads_;
};

}  // namespace luminav_test

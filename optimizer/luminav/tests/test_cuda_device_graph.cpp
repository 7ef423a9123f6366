// tests/test_cuda_device_graph.cpp: the engine's CUDA device (src/engine/gpu_device.cpp on CUDA), steps
// replayed as CUDA graphs: recorded on a layout's second step, replayed with their own zeroed
// flags, equal to eager steps, re-recorded for a new layout, left eager where graphs cannot be
// used; through the fake device of tests/fakes/fake_cuda_device.h, which records stream capture
// and replays graphs in order
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/group_launch.h"
#include "fakes/expect_error.h"
#include "fakes/fake_bundle.h"
#include "fakes/fake_cuda_device.h"
#include "fakes/fake_driver.h"
#include "luminav/error.h"

using luminav::BoundMode;
using luminav::CUdeviceptr;
using luminav::CUresult;
using luminav::CUstream;
using luminav::DType;
using luminav::Engine;
using luminav::EngineOptions;
using luminav::GroupConfig;
using luminav::Hyper;
using luminav::NonFinite;
using luminav::ParamDesc;
using luminav::Status;
using namespace luminav_test;

namespace {

// A launch with its flag argument (the step's found_inf or the reduce's flag) left out, and
// where it ran: what must be equal between an eager and a replayed step.
struct LaunchWithoutFlag {
  std::string kind;
  unsigned grid;
  CUstream stream;
  std::vector<std::uint64_t> args;
  std::uint32_t lr_bits;
  bool operator==(const LaunchWithoutFlag& o) const {
    return kind == o.kind && grid == o.grid && stream == o.stream && args == o.args && lr_bits == o.lr_bits;
  }
  friend void PrintTo(const LaunchWithoutFlag& l, std::ostream* os) {
    *os << l.kind << " grid " << l.grid << " stream " << l.stream << " lr_bits " << l.lr_bits << " args";
    for (std::uint64_t a : l.args) *os << " " << a;
  }
};
std::size_t flag_arg(const std::string& kind) {
  if (kind == "reduce") return kReduceFlag;
  if (kind == "pass2" || kind == "single_pass") return kPass2Flag;  // single pass takes it, unread
  if (kind == "commit") return kCommitFlag;
  return std::size_t(-1);  // pass 1 takes no flag
}
std::vector<LaunchWithoutFlag> without_flags(const std::vector<Launch>& ls) {
  std::vector<LaunchWithoutFlag> out;
  for (const Launch& l : ls) {
    LaunchWithoutFlag w{l.kind, l.grid, l.stream, l.args, l.lr_bits};
    const std::size_t f = flag_arg(l.kind);
    if (f < w.args.size()) w.args[f] = 0;
    out.push_back(w);
  }
  return out;
}
// The distinct flag addresses of a step's launches.
std::set<std::uint64_t> flags_of(const std::vector<Launch>& ls) {
  std::set<std::uint64_t> out;
  for (const Launch& l : ls) {
    const std::size_t f = flag_arg(l.kind);
    if (f < l.args.size()) out.insert(l.args[f]);
  }
  return out;
}

// Two groups: one that skips on non-finite gradients (pass 1, reduce, pass 2, commit), one
// single-pass AdamW group.
Hyper single_pass() {
  Hyper h;
  h.clip = 0;
  h.nonfinite = NonFinite::kPropagate;
  return h;
}

TEST_F(CudaDeviceTest, AGraphStepReplaysTheEagerStepsLaunchesWithItsOwnZeroedFlags) {
  install_graphs();
  write_bundle({config(clip_skip()), config(single_pass())});
  auto e = engine();
  add_group(*e, clip_skip(), {3000, 1, 1024});
  add_group(*e, single_pass(), {5000, 7});
  auto* stream = reinterpret_cast<CUstream>(0x5151);
  e->step(stream);  // the layout's first step: eager, nothing recorded
  EXPECT_EQ(dev().instantiations, 0);
  EXPECT_EQ(dev().graph_launches, 0);
  const std::vector<Launch> eager = dev().launches;
  ASSERT_EQ(kinds(eager), (std::vector<std::string>{"pass1", "reduce", "pass2", "single_pass", "commit", "commit"}));
  for (const Launch& l : eager) EXPECT_FALSE(l.replayed);

  dev().launches.clear();
  e->step(stream);  // recorded on a private stream, then replayed on the caller's
  EXPECT_EQ(dev().streams_created, 1);
  ASSERT_EQ(dev().capture_modes.size(), 1u);
  EXPECT_EQ(dev().instantiations, 1);
  EXPECT_EQ(dev().graph_launches, 1);
  EXPECT_TRUE(dev().graphs.empty()) << "the graph is destroyed once instantiated";
  EXPECT_TRUE(dev().recording.empty()) << "the capture was ended";
  const std::vector<Launch> replayed = dev().launches;
  for (const Launch& l : replayed) EXPECT_TRUE(l.replayed) << l.kind;
  // Same kernels, order, grids, stream and arguments; only the flag pair differs.
  EXPECT_EQ(without_flags(replayed), without_flags(eager));
  const std::set<std::uint64_t> graph_flags = flags_of(replayed);
  ASSERT_EQ(graph_flags.size(), 1u);  // the skipping group's reduce, pass 2 and commits share found_inf
  const std::uint64_t found_inf = *graph_flags.begin();
  EXPECT_EQ(flags_of(eager).count(found_inf), 0u) << "the graph's pair is not the eager step's";
  // The graph's first node zeroes its pair (found_inf and the other flag, 16 bytes each).
  ASSERT_EQ(dev().graph_memsets.size(), 1u);
  EXPECT_EQ(dev().graph_memsets[0].at, found_inf);
  EXPECT_EQ(dev().graph_memsets[0].count, 8u);
  EXPECT_EQ(dev().graph_memsets[0].value, 0u);
  EXPECT_EQ(found_inf % 16, 0u);

  // Every further step replays the same graph: no capture, no instantiation.
  for (int s = 0; s < 3; ++s) {
    dev().launches.clear();
    e->step(stream);
    EXPECT_EQ(without_flags(dev().launches), without_flags(eager)) << "step " << s;
    EXPECT_EQ(flags_of(dev().launches), graph_flags);
  }
  EXPECT_EQ(dev().instantiations, 1);
  EXPECT_EQ(dev().capture_modes.size(), 1u);
  EXPECT_EQ(dev().graph_launches, 4);
  EXPECT_EQ(dev().graph_memsets.size(), 4u);
  for (std::size_t k = 0; k < 5; ++k) EXPECT_EQ(e->param_step(k), 5) << k;
  EXPECT_EQ(e->skipped_steps(), 0);
  e.reset();
  EXPECT_EQ(dev().streams_destroyed, 1);
  EXPECT_TRUE(dev().execs.empty()) << "the engine destroys its graph";
}

// The same steps with and without graphs: a skipped step, lr changes; the same launches, lr
// values seen by the kernels, step counters and skipped count.
TEST_F(CudaDeviceTest, GraphStepsMatchEagerStepsOverASkippedStepAndLrChanges) {
  install_graphs();
  write_bundle({config(clip_skip()), config(single_pass())});
  struct Run {
    std::vector<std::vector<LaunchWithoutFlag>> steps;
    std::vector<std::int64_t> param_steps, skipped;
    int graph_launches = 0;
  };
  auto run = [&](bool graphs) {
    Run r;
    dev() = FakeDevice{};
    params_.clear();
    grads_.clear();
    auto e = engine(7, graphs);
    add_group(*e, clip_skip(), {3000, 1});
    add_group(*e, single_pass(), {2048});
    for (int s = 0; s < 8; ++s) {
      if (s == 3) e->set_lr(0, 5e-4);
      if (s == 5) e->set_lr(1, 2e-2);
      if (s == 6) e->set_lr(0, 1e-3);
      dev().bad_grads = s == 4 || s == 6;  // steps 4 and 6 see a non-finite gradient
      dev().launches.clear();
      e->step(nullptr);
      r.steps.push_back(without_flags(dev().launches));
      r.skipped.push_back(e->skipped_steps());
    }
    for (std::size_t k = 0; k < 3; ++k) r.param_steps.push_back(e->param_step(k));
    r.graph_launches = dev().graph_launches;
    return r;
  };
  const Run eager = run(false);
  const Run graph = run(true);
  EXPECT_EQ(eager.graph_launches, 0);
  EXPECT_EQ(graph.graph_launches, 7);  // every step but the first
  ASSERT_EQ(graph.steps.size(), eager.steps.size());
  // Stream, args and tables are at other addresses in the second run: compare all but pointers.
  auto scalars = [](const std::vector<LaunchWithoutFlag>& ls) {
    std::vector<std::pair<std::string, std::vector<std::uint64_t>>> out;
    for (const LaunchWithoutFlag& l : ls) {
      const KernelSpec spec = kernel_spec(l.kind);
      std::vector<std::uint64_t> v{l.grid, l.lr_bits};
      for (std::size_t a = 0; a < spec.signature.size(); ++a) {
        if (spec.signature[a][0] != '*') v.push_back(l.args[a]);
      }
      out.push_back({l.kind, v});
    }
    return out;
  };
  for (std::size_t s = 0; s < eager.steps.size(); ++s) {
    EXPECT_EQ(scalars(graph.steps[s]), scalars(eager.steps[s])) << "step " << s;
  }
  // The kernels saw the new lr from the step it was set on.
  float lr3 = 0;
  std::memcpy(&lr3, &graph.steps[3][2].lr_bits, 4);
  EXPECT_EQ(graph.steps[3][2].kind, "pass2");
  EXPECT_EQ(lr3, 5e-4f);
  EXPECT_EQ(graph.skipped, eager.skipped);
  EXPECT_EQ(graph.skipped.back(), 2);
  EXPECT_EQ(graph.param_steps, eager.param_steps);
  // The skipping group's tensors missed 2 of 8 steps; the other group's took all 8.
  EXPECT_EQ(graph.param_steps, (std::vector<std::int64_t>{6, 6, 8}));
}

TEST_F(CudaDeviceTest, AGraphStepIsOneGraphLaunchPlusAnLrMemsetOnlyWhenLrChanged) {
  install_graphs();
  write_bundle({config(clip_skip())});
  auto e = engine();
  add_group(*e, clip_skip(), {3000, 3});
  auto* stream = reinterpret_cast<CUstream>(0x99);
  e->step(stream);
  e->step(stream);  // records
  const int allocs = dev().allocs, syncs = dev().syncs, copies = dev().htod + dev().dtoh + dev().dtod;
  const int instantiations = dev().instantiations;
  for (int s = 0; s < 6; ++s) {
    const bool change = s == 2 || s == 5;
    if (change) e->set_lr(0, 1e-3 * (s + 1));
    dev().memsets32.clear();
    dev().launches.clear();
    fake().ctx_queries = 0;
    const int graph_launches = dev().graph_launches;
    e->step(stream);
    EXPECT_EQ(dev().graph_launches - graph_launches, 1) << "step " << s;
    EXPECT_EQ(fake().ctx_queries, 1);
    for (const Launch& l : dev().launches) EXPECT_TRUE(l.replayed) << "no cuLaunchKernel of its own";
    ASSERT_EQ(dev().memsets32.size(), change ? 1u : 0u) << "step " << s;
    if (change) {
      EXPECT_EQ(dev().memsets32[0].count, 1u);
      float lr = 0;
      std::memcpy(&lr, &dev().memsets32[0].value, 4);
      EXPECT_EQ(lr, static_cast<float>(1e-3 * (s + 1)));
      // Written before the graph ran: pass 2 read it.
      EXPECT_EQ(dev().launches[2].lr_bits, dev().memsets32[0].value);
    }
  }
  EXPECT_EQ(dev().instantiations, instantiations);
  EXPECT_EQ(dev().allocs, allocs);
  EXPECT_EQ(dev().syncs, syncs);
  EXPECT_EQ(dev().htod + dev().dtoh + dev().dtod, copies);
}

TEST_F(CudaDeviceTest, AGraphStepAllocatesNothingOnTheHost) {
  install_graphs();
  write_bundle({config(clip_skip()), config(single_pass())});
  auto e = engine();
  add_group(*e, clip_skip(), {3000, 1, 77});
  add_group(*e, single_pass(), {512});
  e->step(nullptr);
  e->step(nullptr);
  ASSERT_EQ(dev().instantiations, 1);
  // The fake's replay allocates; here graph launches and memsets are only counted.
  static int launches = 0, graph_launches = 0, memsets = 0;
  api_.cuLaunchKernel = [](luminav::CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**) {
    ++launches;
    return luminav::CUDA_SUCCESS;
  };
  api_.cuGraphLaunch = [](luminav::CUgraphExec, CUstream) {
    ++graph_launches;
    return luminav::CUDA_SUCCESS;
  };
  api_.cuMemsetD32Async = [](CUdeviceptr, unsigned, size_t, CUstream) {
    ++memsets;
    return luminav::CUDA_SUCCESS;
  };
  launches = graph_launches = memsets = 0;
  const long long before = host_allocations();
  const int steps = 70;
  for (int s = 0; s < steps; ++s) {
    e->set_lr(0, 1e-3 * (1 + s % 3));
    e->step(nullptr);
  }
  EXPECT_EQ(host_allocations() - before, 0);
  EXPECT_EQ(launches, 0);
  EXPECT_EQ(graph_launches, steps);
  EXPECT_EQ(memsets, steps - 1);  // group 0's lr, changed at every step but the first
}

TEST_F(CudaDeviceTest, ANewLayoutRunsEagerlyOnceThenIsRecordedAgain) {
  install_graphs();
  write_bundle({config(clip_skip())});
  auto source = engine(1234);
  add_group(*source, clip_skip(), {3000, 100});
  source->step(nullptr);
  const std::vector<std::uint8_t> state = source->export_state();
  source.reset();

  auto e = engine(99);
  const std::size_t g = add_group(*e, clip_skip(), {3000});
  e->step(nullptr);
  e->step(nullptr);
  ASSERT_EQ(dev().instantiations, 1);
  ASSERT_EQ(dev().execs.size(), 1u);
  // A new parameter: new tables; the old graph is dropped, the step runs eagerly.
  params_.emplace_back(100, 0.25f);
  grads_.emplace_back(100, 0.5f);
  ParamDesc d;
  d.numel = 100;
  d.data = params_.back().data();
  d.grad = grads_.back().data();
  e->add_param(g, d);
  dev().launches.clear();
  e->step(nullptr);
  ASSERT_EQ(kinds(dev().launches), (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  for (const Launch& l : dev().launches) EXPECT_FALSE(l.replayed);
  EXPECT_EQ(dev().launches[3].args[kCommitCount], 3u);  // 2 tensors + the counter
  EXPECT_TRUE(dev().execs.empty());
  const std::vector<Launch> eager = dev().launches;
  dev().launches.clear();
  e->step(nullptr);
  EXPECT_EQ(dev().instantiations, 2);
  EXPECT_EQ(without_flags(dev().launches), without_flags(eager));
  for (const Launch& l : dev().launches) EXPECT_TRUE(l.replayed);
  EXPECT_EQ(dev().streams_created, 1) << "the private stream is kept";

  // Another seed (a state import): recorded again with the new seed in the arguments.
  e->import_state(state.data(), state.size());
  ASSERT_EQ(e->num_params(), 1u + 1u);
  dev().launches.clear();
  e->step(nullptr);
  EXPECT_FALSE(dev().launches[0].replayed);
  EXPECT_EQ(dev().launches[0].args[kPass1Seed], 1234u);
  dev().launches.clear();
  e->step(nullptr);
  EXPECT_EQ(dev().instantiations, 3);
  EXPECT_TRUE(dev().launches[0].replayed);
  EXPECT_EQ(dev().launches[0].args[kPass1Seed], 1234u);
  EXPECT_EQ(dev().launches[2].args[kPass2Seed], 1234u);
}

TEST_F(CudaDeviceTest, StepsStayEagerUnderCaptureWhenTurnedOffOrWithoutGraphCalls) {
  install_graphs();
  write_bundle({config(clip_skip())});
  auto* stream = reinterpret_cast<CUstream>(0x77);
  {
    auto e = engine();
    add_group(*e, clip_skip(), {3000});
    e->step(stream);
    e->step(stream);
    ASSERT_EQ(dev().graph_launches, 1);
    // The caller's stream is being captured: the step is enqueued launch by launch, with the
    // captured step's own flag pair, and the graph is kept for later.
    dev().capturing[stream] = luminav::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    dev().launches.clear();
    dev().memsets32.clear();
    e->step(stream);
    EXPECT_EQ(dev().graph_launches, 1);
    ASSERT_EQ(kinds(dev().launches), (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
    for (const Launch& l : dev().launches) EXPECT_FALSE(l.replayed);
    ASSERT_EQ(dev().memsets32.size(), 1u);
    EXPECT_EQ(dev().launches[2].args[kPass2Flag], dev().memsets32[0].at);
    dev().capturing.erase(stream);
    e->step(stream);
    EXPECT_EQ(dev().graph_launches, 2);
    EXPECT_EQ(dev().instantiations, 1);
  }
  auto steps_eagerly = [&](const char* what, std::unique_ptr<Engine> e) {
    dev() = FakeDevice{};
    add_group(*e, clip_skip(), {3000});
    for (int s = 0; s < 4; ++s) e->step(stream);
    EXPECT_EQ(dev().graph_launches, 0) << what;
    EXPECT_EQ(dev().instantiations, 0) << what;
    EXPECT_EQ(dev().launches.size(), 16u) << what;
    for (const Launch& l : dev().launches) EXPECT_FALSE(l.replayed) << what;
    EXPECT_EQ(e->param_step(0), 4) << what;
  };
  steps_eagerly("EngineOptions::cuda_graph = false", engine(7, false));
  ASSERT_EQ(setenv("LUMINAV_CUDA_GRAPH", "0", 1), 0);
  steps_eagerly("LUMINAV_CUDA_GRAPH=0", engine());
  ASSERT_EQ(setenv("LUMINAV_CUDA_GRAPH", "yes", 1), 0);
  expect_error([&] { engine(); }, Status::kInvalidArgument, {"LUMINAV_CUDA_GRAPH", "\"yes\"", "set it to 0"});
  ASSERT_EQ(unsetenv("LUMINAV_CUDA_GRAPH"), 0);
  api_.cuGraphLaunch = nullptr;
  steps_eagerly("a driver table without cuGraphLaunch", engine());
  api_.cuGraphLaunch = fake_mem::graph_launch;
  api_.cuStreamIsCapturing = nullptr;  // cannot tell whether the caller's stream is captured
  steps_eagerly("a driver table without cuStreamIsCapturing", engine());
}

TEST_F(CudaDeviceTest, ARecordingTheDriverRefusesLeavesStepsEagerAndLosesNothing) {
  install_graphs();
  write_bundle({config(clip_skip())});
  api_.cuGraphInstantiateWithFlags = [](luminav::CUgraphExec*, luminav::CUgraph, unsigned long long) {
    return luminav::CUDA_ERROR_OUT_OF_MEMORY;
  };
  auto e = engine();
  add_group(*e, clip_skip(), {3000});
  for (int s = 0; s < 4; ++s) e->step(nullptr);
  EXPECT_EQ(dev().capture_modes.size(), 1u) << "one recording tried, not one per step";
  EXPECT_TRUE(dev().recording.empty()) << "the capture was ended";
  EXPECT_TRUE(dev().graphs.empty()) << "the captured graph was destroyed";
  EXPECT_EQ(dev().graph_launches, 0);
  EXPECT_EQ(dev().launches.size(), 16u) << "every step ran, eagerly";
  EXPECT_EQ(e->param_step(0), 4);
  EXPECT_EQ(e->skipped_steps(), 0);
}

}  // namespace

// The engine's CUDA path driven through an injected driver table whose "device memory" is host
// memory: what a step enqueues (launches and their arguments, the device tables, memsets), what
// it allocates or synchronises, how it makes its context current, and what it refuses before
// enqueuing anything. The fake computes no update; it does what the step's bookkeeping needs:
// its reduce raises the flag it is given when a test says the gradients are not finite, and its
// commit advances every table row's STEP by 1 - found_inf. Stream capture and graphs are
// recorded and replayed in order, so graph steps are checked against eager ones. Update results
// are checked on a GPU (`luminav selftest`, the GPU tests of tests/).
#include <atomic>
#include <cstdlib>
#include <list>
#include <map>
#include <new>
#include <set>

#include "fakes/fake_bundle.h"
#include "engine/group_launch.h"
#include "engine/engine.h"

// Host allocations of the whole test program, counted: a step must make none. The replacement
// pair is malloc/free on both sides; GCC, seeing free() in a replaced operator delete, cannot
// tell that the matching operator new is replaced too, hence the pragma.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<long long> g_news{0};
}
void* operator new(std::size_t n) {
  ++g_news;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

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

// The kernels in the order of FakeState::entries: fake_function(i) is kKinds[i]'s. The bundles
// of these tests name the commit without CHECK_FLAG by an entry of its own (kCommitF0Entry), so
// that the fake's commit knows whether to read found_inf; its kind is "commit" too.
const char* const kKinds[] = {"pass1", "reduce", "pass2", "single_pass", "commit", "commit"};
constexpr std::size_t kCommitF0 = 5;
constexpr const char* kCommitF0Entry = "_lumina_tdclm_commit_kernel_nocheck";

struct Launch {
  std::string kind;
  unsigned grid;
  CUstream stream;
  std::vector<std::uint64_t> args;  // each user argument's value, zero-extended
  bool replayed = false;            // run by cuGraphLaunch (not by cuLaunchKernel)
  std::uint32_t lr_bits = 0;        // pass 2 / single pass: the lr in device memory when it ran
  bool reads_flag = true;           // commit: CHECK_FLAG = 1
};

struct Memset {
  CUdeviceptr at;
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

struct Device {
  std::vector<Launch> launches;
  std::vector<Memset> memsets32;  // on a stream (a graph's memsets are in graph_memsets)
  int allocs = 0, frees = 0, syncs = 0, htod = 0, dtoh = 0, dtod = 0;
  std::map<CUstream, luminav::CUstreamCaptureStatus> capturing;
  bool bad_grads = false;  // the reduce raises its flag: the step saw a non-finite gradient
  // Graphs: streams being captured (cuStreamBeginCapture), graphs and executable graphs by handle.
  std::map<CUstream, std::vector<Op>> recording;
  std::map<std::uintptr_t, std::vector<Op>> graphs, execs;
  std::vector<luminav::CUstreamCaptureMode> capture_modes;
  std::vector<Memset> graph_memsets;
  std::uintptr_t next_handle = 0x1000;
  int streams_created = 0, streams_destroyed = 0, instantiations = 0, graph_launches = 0;
};

Device& dev() {
  static Device d;
  return d;
}

namespace fake_mem {
using namespace luminav;
CUresult alloc(CUdeviceptr* p, size_t bytes) {
  ++dev().allocs;
  void* m = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = reinterpret_cast<std::uintptr_t>(m);
  return CUDA_SUCCESS;
}
CUresult free_(CUdeviceptr p) {
  ++dev().frees;
  std::free(reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)));
  return CUDA_SUCCESS;
}
void* at(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }
CUresult htod(CUdeviceptr d, const void* s, size_t n) {
  ++dev().htod;
  std::memcpy(at(d), s, n);
  return CUDA_SUCCESS;
}
CUresult dtoh(void* d, CUdeviceptr s, size_t n) {
  ++dev().dtoh;
  std::memcpy(d, at(s), n);
  return CUDA_SUCCESS;
}
CUresult dtod_async(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream) {
  ++dev().dtod;
  std::memcpy(at(d), at(s), n);
  return CUDA_SUCCESS;
}
CUresult memset8(CUdeviceptr d, unsigned char v, size_t n, CUstream) {
  std::memset(at(d), v, n);
  return CUDA_SUCCESS;
}
void fill32(const Memset& m) {
  auto* w = static_cast<std::uint32_t*>(at(m.at));
  for (size_t i = 0; i < m.count; ++i) w[i] = m.value;
}
CUresult memset32(CUdeviceptr d, unsigned v, size_t n, CUstream stream) {
  auto rec = dev().recording.find(stream);
  if (rec != dev().recording.end()) {
    rec->second.push_back({false, {}, {d, v, n}});
    return CUDA_SUCCESS;
  }
  dev().memsets32.push_back({d, v, n});
  fill32({d, v, n});
  return CUDA_SUCCESS;
}
CUresult sync() {
  ++dev().syncs;
  return CUDA_SUCCESS;
}
CUresult stream_sync(CUstream) { return sync(); }
CUresult is_capturing(CUstream s, CUstreamCaptureStatus* status) {
  auto it = dev().capturing.find(s);
  *status = it == dev().capturing.end() ? CU_STREAM_CAPTURE_STATUS_NONE : it->second;
  return CUDA_SUCCESS;
}
// Runs a launch: what the step's bookkeeping needs of each kernel (see the top of the file).
void run(Launch l) {
  if (l.kind == "reduce" && dev().bad_grads) *static_cast<std::int32_t*>(at(l.args[4])) = 1;
  if (l.kind == "pass2" || l.kind == "single_pass") std::memcpy(&l.lr_bits, at(l.args[4]), 4);
  if (l.kind == "commit") {
    const std::int32_t found_inf = l.reads_flag ? *static_cast<const std::int32_t*>(at(l.args[1])) : 0;
    const auto* table = static_cast<const std::int64_t*>(at(l.args[0]));
    for (std::uint64_t r = 0; r < l.args[2]; ++r) {
      *static_cast<std::int64_t*>(at(static_cast<CUdeviceptr>(table[r * luminav::gpu::kTableCols + 5]))) += 1 - found_inf;
    }
  }
  dev().launches.push_back(l);
}
CUresult launch(CUfunction f, unsigned gx, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream stream,
                void** params, void**) {
  for (std::size_t i = 0; i < std::size(kKinds); ++i) {
    if (f != fake_fn::fake_function(i)) continue;
    Launch l{kKinds[i], gx, stream, {}};
    l.reads_flag = i != kCommitF0;
    const KernelSpec spec = kernel_spec(kKinds[i]);
    for (std::size_t a = 0; a < spec.signature.size(); ++a) {
      const luminav::ArgType t = luminav::ArgType::parse(spec.signature[a]);
      std::uint64_t v = 0;
      std::memcpy(&v, params[a], t.size);
      l.args.push_back(v);
    }
    auto rec = dev().recording.find(stream);
    if (rec != dev().recording.end()) {
      rec->second.push_back({true, l, {}});  // the argument values as they were at capture
    } else {
      run(l);
    }
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}
std::uintptr_t new_handle() { return dev().next_handle += 0x10; }
CUresult stream_create(CUstream* s, unsigned) {
  ++dev().streams_created;
  *s = reinterpret_cast<CUstream>(new_handle());
  return CUDA_SUCCESS;
}
CUresult stream_destroy(CUstream) {
  ++dev().streams_destroyed;
  return CUDA_SUCCESS;
}
CUresult begin_capture(CUstream s, CUstreamCaptureMode mode) {
  if (dev().recording.count(s)) return CUDA_ERROR_INVALID_VALUE;
  dev().recording[s] = {};
  dev().capturing[s] = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  dev().capture_modes.push_back(mode);
  return CUDA_SUCCESS;
}
CUresult end_capture(CUstream s, CUgraph* g) {
  auto rec = dev().recording.find(s);
  if (rec == dev().recording.end()) return CUDA_ERROR_INVALID_VALUE;
  const std::uintptr_t h = new_handle();
  dev().graphs[h] = std::move(rec->second);
  dev().recording.erase(rec);
  dev().capturing.erase(s);
  *g = reinterpret_cast<CUgraph>(h);
  return CUDA_SUCCESS;
}
CUresult instantiate(CUgraphExec* e, CUgraph g, unsigned long long) {
  auto it = dev().graphs.find(reinterpret_cast<std::uintptr_t>(g));
  if (it == dev().graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  ++dev().instantiations;
  const std::uintptr_t h = new_handle();
  dev().execs[h] = it->second;
  *e = reinterpret_cast<CUgraphExec>(h);
  return CUDA_SUCCESS;
}
CUresult graph_destroy(CUgraph g) {
  return dev().graphs.erase(reinterpret_cast<std::uintptr_t>(g)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult exec_destroy(CUgraphExec e) {
  return dev().execs.erase(reinterpret_cast<std::uintptr_t>(e)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
// Replays the recorded work in order on `stream`.
CUresult graph_launch(CUgraphExec e, CUstream stream) {
  auto it = dev().execs.find(reinterpret_cast<std::uintptr_t>(e));
  if (it == dev().execs.end()) return CUDA_ERROR_INVALID_VALUE;
  ++dev().graph_launches;
  for (const Op& op : it->second) {
    if (op.is_launch) {
      Launch l = op.launch;
      l.stream = stream;
      l.replayed = true;
      run(l);
    } else {
      dev().graph_memsets.push_back(op.memset);
      fill32(op.memset);
    }
  }
  return CUDA_SUCCESS;
}
}  // namespace fake_mem

// Argument positions (docs/internals.md "Kernels").
constexpr std::size_t kTable = 0;
constexpr std::size_t kPass1Seed = 4;
constexpr std::size_t kReduceFlag = 4, kReduceCount = 5;
constexpr std::size_t kPass2Flag = 3, kPass2Seed = 5;
constexpr std::size_t kCommitFlag = 1, kCommitCount = 2;

class EngineCudaTest : public FakeDriverFixture {
 protected:
  void SetUp() override {
    FakeDriverFixture::SetUp();
    dev() = Device{};
    fake().entries.assign(std::begin(kKinds), std::end(kKinds));
    for (std::size_t i = 0; i < fake().entries.size(); ++i) fake().entries[i] = kernel_spec(kKinds[i]).name;
    fake().entries[kCommitF0] = kCommitF0Entry;
    api_.cuFuncGetParamInfo = nullptr;  // the fake's answers are pass 2's only
    api_.cuMemAlloc = fake_mem::alloc;
    api_.cuMemFree = fake_mem::free_;
    api_.cuMemcpyHtoD = fake_mem::htod;
    api_.cuMemcpyDtoH = fake_mem::dtoh;
    api_.cuMemcpyDtoDAsync = fake_mem::dtod_async;
    api_.cuMemsetD8Async = fake_mem::memset8;
    api_.cuMemsetD32Async = fake_mem::memset32;
    api_.cuCtxSynchronize = fake_mem::sync;
    api_.cuStreamSynchronize = fake_mem::stream_sync;
    api_.cuStreamIsCapturing = fake_mem::is_capturing;
    api_.cuLaunchKernel = fake_mem::launch;
    api_.cuStreamCreate = fake_mem::stream_create;
    api_.cuStreamDestroy = fake_mem::stream_destroy;
    // As a program using the engine would: the device's primary context is current.
    fake().ctx_stack.push_back(fake_primary_ctx(0));
  }

  // A bundle with every variant the given groups run (sm_90).
  void write_bundle(const std::vector<GroupConfig>& cfgs) {
    std::map<std::string, std::string> keys;  // key -> kernel
    for (const GroupConfig& c : cfgs) {
      const luminav::gpu::VariantKeys k = luminav::gpu::variant_keys(c);
      for (const auto& [key, kind] : {std::make_pair(k.pass1, "pass1"), std::make_pair(k.reduce, "reduce"),
                                      std::make_pair(k.pass2, "pass2"), std::make_pair(k.single_pass, "single_pass"),
                                      std::make_pair(k.commit, "commit")}) {
        if (!key.empty()) keys[key] = kind;
      }
      keys[luminav::gpu::commit_key(true)] = "commit";
    }
    std::vector<json> entries;
    for (const auto& [key, kind] : keys) {
      KernelSpec spec = kernel_spec(kind);
      if (key == luminav::gpu::commit_key(false)) spec.name = kCommitF0Entry;
      entries.push_back(add_variant(dir_, key, 90, "", spec));
    }
    write_manifest(dir_, manifest_with(entries));
  }
  std::string cubin_of(const std::string& key) const { return dir_.file(key + ".sm90.cubin"); }

  static GroupConfig config(const Hyper& h) {
    GroupConfig c;
    c.hyper = h;
    c.state_dtype = h.state_dtype;
    return c;
  }

  // The capture and graph calls of the table (left out, steps stay eager).
  void install_graphs() {
    api_.cuStreamBeginCapture = fake_mem::begin_capture;
    api_.cuStreamEndCapture = fake_mem::end_capture;
    api_.cuGraphInstantiateWithFlags = fake_mem::instantiate;
    api_.cuGraphLaunch = fake_mem::graph_launch;
    api_.cuGraphDestroy = fake_mem::graph_destroy;
    api_.cuGraphExecDestroy = fake_mem::exec_destroy;
  }

  std::unique_ptr<Engine> engine(std::uint64_t seed = 7, bool cuda_graph = true) {
    EngineOptions o;
    o.device = luminav::DeviceType::kCuda;
    o.bundle_dir = dir_.path();
    o.seed = seed;
    o.cuda_graph = cuda_graph;
    return std::make_unique<Engine>(o);
  }

  // Tensors of `numels` elements (fp32, host memory standing in for device memory).
  std::size_t add_group(Engine& e, const Hyper& h, const std::vector<std::int64_t>& numels) {
    const std::size_t g = e.add_group(h);
    for (std::int64_t n : numels) {
      params_.emplace_back(static_cast<std::size_t>(n), 0.25f);
      grads_.emplace_back(static_cast<std::size_t>(n), 0.5f);
      ParamDesc d;
      d.numel = n;
      d.data = n ? params_.back().data() : nullptr;
      d.grad = n ? grads_.back().data() : static_cast<const void*>(&grads_);  // a gradient, even if empty
      e.add_param(g, d);
    }
    return g;
  }

  static std::vector<std::int64_t> table(const Launch& l, std::size_t rows) {
    std::vector<std::int64_t> t(rows * luminav::gpu::kTableCols);
    std::memcpy(t.data(), fake_mem::at(l.args[kTable]), t.size() * 8);
    return t;
  }
  static std::vector<std::string> kinds(const std::vector<Launch>& ls) {
    std::vector<std::string> k;
    for (const Launch& l : ls) k.push_back(l.kind);
    return k;
  }

  TempDir dir_;
  std::list<std::vector<float>> params_, grads_;
};

Hyper clip_skip() {
  Hyper h;
  h.clip = 4.0;
  h.nonfinite = NonFinite::kSkip;
  return h;
}

TEST_F(EngineCudaTest, AStepIsItsKernelsOnlyAndTheFirstSkippingGroupCountsAppliedSteps) {
  write_bundle({config(clip_skip())});
  auto e = engine();
  const std::vector<std::int64_t> numels = {3000, 1, 1024, 0, 2500};
  add_group(*e, clip_skip(), numels);
  auto* stream = reinterpret_cast<CUstream>(0x5151);
  e->step(stream);
  const Device first = dev();
  EXPECT_EQ(kinds(first.launches), (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  dev().launches.clear();
  dev().memsets32.clear();
  const int allocs = dev().allocs, syncs = dev().syncs, copies = dev().htod + dev().dtoh + dev().dtod;
  for (int s = 0; s < 3; ++s) e->step(stream);
  // No separate launch counts applied steps; nothing allocates, copies or synchronises.
  ASSERT_EQ(dev().launches.size(), 12u);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(kinds({dev().launches.begin() + 4 * s, dev().launches.begin() + 4 * s + 4}),
              (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  }
  EXPECT_EQ(dev().allocs, allocs);
  EXPECT_EQ(dev().syncs, syncs);
  EXPECT_EQ(dev().htod + dev().dtoh + dev().dtod, copies);
  EXPECT_TRUE(dev().memsets32.empty());  // lr unchanged, flags from the ring zeroed at the first step

  const Launch& pass1 = dev().launches[0];
  const Launch& reduce = dev().launches[1];
  const Launch& pass2 = dev().launches[2];
  const Launch& commit = dev().launches[3];
  for (const Launch& l : dev().launches) EXPECT_EQ(l.stream, stream);
  const unsigned nblocks = 3 + 1 + 1 + 0 + 3;  // cdiv(numel, 1024) per tensor
  EXPECT_EQ(pass1.grid, nblocks);
  EXPECT_EQ(pass2.grid, nblocks);
  EXPECT_EQ(reduce.grid, 5u);  // one program per tensor; the counter's row is outside the grid
  EXPECT_EQ(reduce.args[kReduceCount], 5u);
  EXPECT_EQ(commit.grid, 1u);
  EXPECT_EQ(commit.args[kCommitCount], 6u);  // 5 tensors + the applied-step counter's row
  EXPECT_EQ(commit.args[kTable], pass1.args[kTable]);

  // The table: the tensors' rows, then a row with no elements whose STEP is the counter.
  constexpr std::size_t kCols = luminav::gpu::kTableCols;
  const std::vector<std::int64_t> t = table(commit, 6);
  std::int64_t start = 0;
  for (std::size_t j = 0; j < 5; ++j) {
    EXPECT_EQ(t[j * kCols + 6], numels[j]) << j;
    EXPECT_EQ(t[j * kCols + 7], start) << j;
    EXPECT_EQ(t[j * kCols + 9], static_cast<std::int64_t>(j)) << j;
    start += (numels[j] + 1023) / 1024;
  }
  const std::int64_t* counter_row = &t[5 * kCols];
  for (std::size_t col = 0; col < kCols; ++col) {
    if (col != 5) {
      EXPECT_EQ(counter_row[col], 0) << "column " << col;
    }
  }
  ASSERT_NE(counter_row[5], 0);
  std::set<std::int64_t> step_counters;
  for (std::size_t j = 0; j < 5; ++j) step_counters.insert(t[j * kCols + 5]);
  EXPECT_EQ(step_counters.count(counter_row[5]), 0u) << "the counter is none of the tensors' step counters";
  // skipped = steps with a skipping group - applied: the counter the row points at is the one read.
  *static_cast<std::int64_t*>(fake_mem::at(static_cast<CUdeviceptr>(counter_row[5]))) = 3;
  EXPECT_EQ(e->skipped_steps(), 4 - 3);
  EXPECT_EQ(first.launches[3].args[kCommitCount], 6u);

  // pass 2 and commit read the step's found_inf, which the reduce raises.
  EXPECT_EQ(reduce.args[kReduceFlag], pass2.args[kPass2Flag]);
  EXPECT_EQ(commit.args[kCommitFlag], pass2.args[kPass2Flag]);
}

TEST_F(EngineCudaTest, EachStepTakesAZeroedFlagPairAndTheRingIsZeroedOncePerCycle) {
  write_bundle({config(clip_skip())});
  auto e = engine();
  add_group(*e, clip_skip(), {5000, 7});
  const int steps = 140;
  std::vector<CUdeviceptr> flags;
  std::vector<std::size_t> ring_zeroed_at;  // steps whose memsets included the ring's
  CUdeviceptr ring = 0;
  std::size_t ring_words = 0;
  for (int s = 0; s < steps; ++s) {
    dev().launches.clear();
    dev().memsets32.clear();
    e->step(nullptr);
    ASSERT_EQ(dev().launches.size(), 4u);
    flags.push_back(dev().launches[2].args[kPass2Flag]);
    for (const Memset& m : dev().memsets32) {
      if (m.count > 2) {
        ring_zeroed_at.push_back(static_cast<std::size_t>(s));
        if (ring == 0) {
          ring = m.at;
          ring_words = m.count;
        }
        EXPECT_EQ(m.at, ring);
        EXPECT_EQ(m.value, 0u);
      }
    }
  }
  ASSERT_NE(ring, 0u);
  // Pairs of flags, each flag on its own 16 bytes (bundle kernels assume aligned pointers).
  const std::size_t pair_bytes = 32;
  const std::size_t slots = ring_words * 4 / pair_bytes;
  ASSERT_GE(slots, 2u);
  std::vector<std::size_t> expected_zeroing;
  for (std::size_t s = 0; s < static_cast<std::size_t>(steps); s += slots) expected_zeroing.push_back(s);
  EXPECT_EQ(ring_zeroed_at, expected_zeroing);
  for (std::size_t s = 0; s < flags.size(); ++s) {
    // Inside the ring, 8-byte pairs in order; a pair is used once per cycle.
    EXPECT_EQ(flags[s], ring + (s % slots) * pair_bytes) << "step " << s;
  }
}

TEST_F(EngineCudaTest, AStepUnderGraphCaptureZeroesItsOwnFlagsOutsideTheRing) {
  write_bundle({config(clip_skip())});
  auto e = engine();
  add_group(*e, clip_skip(), {3000});
  auto* stream = reinterpret_cast<CUstream>(0x77);
  e->step(stream);  // the first step builds the tables (not capturable)
  const CUdeviceptr ring_pair = dev().launches[2].args[kPass2Flag];
  for (int replay = 0; replay < 3; ++replay) {
    dev().capturing[stream] = luminav::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    dev().launches.clear();
    dev().memsets32.clear();
    e->step(stream);
    ASSERT_EQ(dev().memsets32.size(), 1u);
    const Memset m = dev().memsets32[0];
    EXPECT_EQ(m.count, 8u);  // the step's own pair (2 flags of 16 bytes), zeroed inside the captured work
    EXPECT_EQ(m.value, 0u);
    for (const Launch& l : dev().launches) {
      const std::size_t flag = l.kind == "reduce" ? kReduceFlag : l.kind == "pass2" ? kPass2Flag : kCommitFlag;
      if (l.kind != "pass1") {
        EXPECT_EQ(l.args[flag], m.at) << l.kind;
      }
    }
    EXPECT_NE(m.at, ring_pair);
    EXPECT_FALSE(m.at >= ring_pair && m.at < ring_pair + 64 * 32) << "the captured pair is not in the ring";
  }
  // Eager again: the next pair of the ring, no memset.
  dev().capturing.clear();
  dev().launches.clear();
  dev().memsets32.clear();
  e->step(stream);
  EXPECT_TRUE(dev().memsets32.empty());
  EXPECT_EQ(dev().launches[2].args[kPass2Flag], ring_pair + 32);
  // A driver table that cannot say whether a stream is captured: every step zeroes its pair.
  api_.cuStreamIsCapturing = nullptr;
  dev().memsets32.clear();
  e->step(stream);
  e->step(stream);
  EXPECT_EQ(dev().memsets32.size(), 2u);
  for (const Memset& m : dev().memsets32) EXPECT_EQ(m.count, 8u);
}

TEST_F(EngineCudaTest, GroupsThatDoNotSkipRaiseAFlagOfTheirOwnAndOnlyTheFirstSkippingGroupCounts) {
  Hyper propagate = clip_skip();
  propagate.nonfinite = NonFinite::kPropagate;  // pass 1 for the clip, no skip
  Hyper skip_noclip = clip_skip();
  skip_noclip.clip = 0;  // pass 1 for the flag only
  Hyper adamw = propagate;
  adamw.clip = 0;  // single pass
  const Hyper skip_too = clip_skip();
  write_bundle({config(propagate), config(skip_noclip), config(adamw), config(skip_too)});
  auto e = engine();
  add_group(*e, propagate, {2000, 30});
  add_group(*e, skip_noclip, {100});
  add_group(*e, adamw, {4096, 1, 5});
  add_group(*e, skip_too, {10, 20});
  e->step(nullptr);
  dev().launches.clear();
  e->step(nullptr);
  EXPECT_EQ(kinds(dev().launches),
            (std::vector<std::string>{"pass1", "reduce", "pass1", "reduce", "pass1", "reduce", "pass2", "pass2",
                                      "single_pass", "pass2", "commit", "commit", "commit", "commit"}));
  const auto& l = dev().launches;
  const std::uint64_t found_inf = l[7].args[kPass2Flag];  // the skipping group's pass 2
  EXPECT_EQ(l[1].args[kReduceFlag], found_inf + 16);      // propagate: its own flag
  EXPECT_EQ(l[3].args[kReduceFlag], found_inf);           // skip
  EXPECT_EQ(l[5].args[kReduceFlag], found_inf);           // skip
  EXPECT_EQ(l[9].args[kPass2Flag], found_inf);
  // Commit counts: the first skipping group's table has the counter's row, no other.
  EXPECT_EQ(l[10].args[kCommitCount], 2u);
  EXPECT_EQ(l[11].args[kCommitCount], 2u);  // 1 tensor + the counter
  EXPECT_EQ(l[12].args[kCommitCount], 3u);
  EXPECT_EQ(l[13].args[kCommitCount], 2u);
  EXPECT_EQ(table(l[11], 2)[luminav::gpu::kTableCols + 6], 0);  // the counter's row has no elements
  EXPECT_EQ(l[11].args[kCommitFlag], found_inf);
  EXPECT_EQ(l[13].args[kCommitFlag], found_inf);
  // Every pointer a bundle kernel gets is 16-byte aligned (docs/bundle-format.md).
  for (const Launch& launch : l) {
    const KernelSpec spec = kernel_spec(launch.kind);
    for (std::size_t a = 0; a < spec.signature.size(); ++a) {
      if (spec.signature[a][0] == '*') {
        EXPECT_EQ(launch.args[a] % 16, 0u) << launch.kind << " argument " << spec.arg_names[a];
      }
    }
  }
  EXPECT_EQ(l[3].grid, 1u);  // the counting group's reduce: its one tensor only
  EXPECT_EQ(l[3].args[kReduceCount], 1u);
  EXPECT_EQ(l[5].grid, 2u);
  EXPECT_EQ(l[5].args[kReduceCount], 2u);
}

TEST_F(EngineCudaTest, TheContextIsMadeCurrentOncePerStepAndPushedOnlyWhenItIsNot) {
  write_bundle({config(clip_skip())});
  auto e = engine();
  add_group(*e, clip_skip(), {3000, 3});
  e->step(nullptr);
  fake().ctx_queries = fake().ctx_pushes = 0;
  for (int s = 0; s < 5; ++s) e->step(nullptr);
  EXPECT_EQ(fake().ctx_queries, 5);  // one cuCtxGetCurrent per step, none per launch
  EXPECT_EQ(fake().ctx_pushes, 0);   // the primary context was current
  fake().ctx_stack.push_back(fake_user_ctx());  // the caller has another context current
  fake().ctx_queries = fake().ctx_pushes = 0;
  dev().launches.clear();
  for (int s = 0; s < 5; ++s) e->step(nullptr);
  EXPECT_EQ(fake().ctx_pushes, 5);
  ASSERT_EQ(fake().ctx_stack.size(), 2u);
  EXPECT_EQ(fake().ctx_stack.back(), fake_user_ctx());  // restored after every step
}

TEST_F(EngineCudaTest, AStepAllocatesNothingOnTheHost) {
  Hyper bounded = clip_skip();
  bounded.bound_mode = BoundMode::kRel;
  bounded.bound = 0.5;
  write_bundle({config(clip_skip()), config(bounded)});
  auto e = engine();
  add_group(*e, clip_skip(), {3000, 1, 77});
  add_group(*e, bounded, {512});
  e->step(nullptr);
  e->step(nullptr);
  // The fake's recording allocates; here launches and memsets are only counted.
  static int launches = 0, memsets = 0;
  api_.cuLaunchKernel = [](luminav::CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**) {
    ++launches;
    return luminav::CUDA_SUCCESS;
  };
  api_.cuMemsetD32Async = [](CUdeviceptr, unsigned, size_t, CUstream) {
    ++memsets;
    return luminav::CUDA_SUCCESS;
  };
  launches = memsets = 0;
  const long long before = g_news.load();
  const int steps = 70;  // past the flag ring's wrap at the 64th step
  for (int s = 0; s < steps; ++s) {
    e->set_lr(0, 1e-3 * (1 + s % 3));  // a changed lr: a memset, no allocation
    e->step(nullptr);
  }
  EXPECT_EQ(g_news.load() - before, 0);
  EXPECT_EQ(launches, steps * 8);
  // Group 0's lr at every step but the first (1e-3, as before), and the flag ring once.
  EXPECT_EQ(memsets, (steps - 1) + 1);
}

TEST_F(EngineCudaTest, ASeedSetByImportReachesTheKernels) {
  write_bundle({config(clip_skip())});
  auto source = engine(1234);
  add_group(*source, clip_skip(), {3000});
  source->step(nullptr);
  const std::vector<std::uint8_t> state = source->export_state();
  auto e = engine(99);
  add_group(*e, clip_skip(), {3000});
  e->step(nullptr);
  EXPECT_EQ(dev().launches.back().kind, "commit");
  dev().launches.clear();
  e->step(nullptr);
  EXPECT_EQ(dev().launches[0].args[kPass1Seed], 99u);
  e->import_state(state.data(), state.size());
  EXPECT_EQ(e->seed(), 1234u);
  dev().launches.clear();
  e->step(nullptr);
  ASSERT_EQ(kinds(dev().launches), (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  EXPECT_EQ(dev().launches[0].args[kPass1Seed], 1234u);
  EXPECT_EQ(dev().launches[2].args[kPass2Seed], 1234u);
}

TEST_F(EngineCudaTest, ACorruptCubinIsRefusedWhenFirstNeededBeforeAnythingIsEnqueued) {
  Hyper bounded = clip_skip();
  bounded.bound_mode = BoundMode::kAbs;  // the first step would also copy p into p_init
  const GroupConfig cfg = config(bounded);
  write_bundle({cfg});
  const std::string pass1_key = luminav::gpu::variant_keys(cfg).pass1;
  const std::vector<unsigned char> good = [&] {
    std::ifstream f(cubin_of(pass1_key), std::ios::binary);
    return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }();
  write_bytes(cubin_of(pass1_key), make_fake_cubin("corrupt"));
  auto e = engine();  // reads the manifest only: the corrupt cubin is not touched yet
  add_group(*e, bounded, {3000});
  const std::vector<float> before = params_.back();
  const int copies = dev().dtod;
  expect_error([&] { e->step(nullptr); }, Status::kBundleError,
               {"field \"sha256\"", cubin_of(pass1_key), "rebuild the bundle"});
  EXPECT_TRUE(dev().launches.empty());
  EXPECT_EQ(dev().dtod, copies);  // p_init not copied either
  EXPECT_EQ(fake().module_loads, 0);
  EXPECT_EQ(params_.back(), before);
  EXPECT_EQ(e->param_step(0), 0);
  // Repaired, the next step runs.
  write_bytes(cubin_of(pass1_key), good);
  e->step(nullptr);
  EXPECT_EQ(kinds(dev().launches), (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  EXPECT_EQ(dev().dtod, copies + 1);
}

TEST_F(EngineCudaTest, ABundleForAnotherTableLayoutIsRefusedBeforeAnythingIsEnqueued) {
  static_assert(luminav::gpu::kTableCols == 18, "aot_fixtures.h writes table_cols 18");
  const Hyper h = clip_skip();
  write_bundle({config(h)});
  // A bundle of the first format: its kernels read 12-column tables.
  json man = json::parse(read_text(dir_.file("manifest.json")));
  man["format_version"] = 1;
  man.erase("table_cols");
  write_manifest(dir_, man);
  auto e = engine();
  add_group(*e, h, {3000});
  const std::vector<float> before = params_.back();
  expect_error([&] { e->step(nullptr); }, Status::kBundleError,
               {dir_.path(), "format_version 1", "tables of 12 columns", "writes 18",
                "luminamoon aot build --out " + dir_.path()});
  EXPECT_TRUE(dev().launches.empty());
  EXPECT_EQ(params_.back(), before);
  EXPECT_EQ(e->param_step(0), 0);
}

// ---------------------------------------------------------------------------------------------
// Graph replay.

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

TEST_F(EngineCudaTest, AGraphStepReplaysTheEagerStepsLaunchesWithItsOwnZeroedFlags) {
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
TEST_F(EngineCudaTest, GraphStepsMatchEagerStepsOverASkippedStepAndLrChanges) {
  install_graphs();
  write_bundle({config(clip_skip()), config(single_pass())});
  struct Run {
    std::vector<std::vector<LaunchWithoutFlag>> steps;
    std::vector<std::int64_t> param_steps, skipped;
    int graph_launches = 0;
  };
  auto run = [&](bool graphs) {
    Run r;
    dev() = Device{};
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

TEST_F(EngineCudaTest, AGraphStepIsOneGraphLaunchPlusAnLrMemsetOnlyWhenLrChanged) {
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

TEST_F(EngineCudaTest, AGraphStepAllocatesNothingOnTheHost) {
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
  const long long before = g_news.load();
  const int steps = 70;
  for (int s = 0; s < steps; ++s) {
    e->set_lr(0, 1e-3 * (1 + s % 3));
    e->step(nullptr);
  }
  EXPECT_EQ(g_news.load() - before, 0);
  EXPECT_EQ(launches, 0);
  EXPECT_EQ(graph_launches, steps);
  EXPECT_EQ(memsets, steps - 1);  // group 0's lr, changed at every step but the first
}

TEST_F(EngineCudaTest, ANewLayoutRunsEagerlyOnceThenIsRecordedAgain) {
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

TEST_F(EngineCudaTest, StepsStayEagerUnderCaptureWhenTurnedOffOrWithoutGraphCalls) {
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
    dev() = Device{};
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

TEST_F(EngineCudaTest, ARecordingTheDriverRefusesLeavesStepsEagerAndLosesNothing) {
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

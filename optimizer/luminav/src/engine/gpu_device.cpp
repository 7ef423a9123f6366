// src/engine/gpu_device.cpp: the engine's GPU device, one for both vendors: the AOT bundle's
// kernels launched on the caller's stream, eagerly or (CUDA) replayed as a CUDA graph
//
// Every driver call goes through the vendor interface of engine/gpu_driver.h (CUDA:
// cuda_gpu_driver.cpp; HIP: hip_gpu_driver.cpp); the driver calls named below are CUDA's, HIP's
// are their hip* twins. Per launch group, built before the first step after the group's rows
// change (cuMemAlloc + cuMemcpyHtoD): the table, the block map, partial sums/flags, stats, the
// group's lr as a device float32 written with cuMemsetD32Async only when its bits change, and
// its launches with every argument bound once (GpuGroupLaunches). Device-wide: the
// applied-step counter and the step flags (below).
//
// The skipped-step count needs no launch of its own and no host sync: the table of the first
// group that skips on non-finite gradients has one extra row, NUMEL 0, whose STEP column points
// at the engine's applied-step counter. A row without elements owns no program of pass 1 or
// pass 2 and is outside the reduce grid, so only that group's commit sees it, and commit adds
// 1 - found_inf to it as to every tensor's counter. skipped = (steps that had a skipping
// group) - applied.
//
// Step flags: found_inf (a skipping group saw a non-finite gradient) and, next to it, the flag
// the reduce of a group that does not skip raises (its non-finite gradients must not skip
// anyone else's step; nothing reads it). Each step needs a zeroed pair. Eager steps take the
// next pair of a ring of kFlagSlots, and the whole ring is zeroed by one cuMemsetD32Async when
// the step wraps to its first pair: every earlier step that used a pair is before the memset
// in stream order. A step enqueued while the stream is being captured into a CUDA graph
// zeroes a pair of its own (the graph then zeroes it at every replay); that pair is outside the
// ring.
//
// Per eager step, then: one cuCtxGetCurrent (a push only when the primary context is not
// current), one cuStreamIsCapturing, the launches (pass 1 and reduce where needed, pass 2,
// commit), and a cuMemsetD32Async only every kFlagSlots steps or when lr changed. After the
// first step, step() allocates nothing and never synchronises (except nonfinite='raise', which
// must read the flag on the host), so it can be captured in a CUDA graph.
//
// Graph replay: the first step of a layout (the groups' caches and seeds) is eager; the next
// one records the same work once into a CUDA graph, by capturing it on a private stream: a
// memset node zeroing a flag pair of the graph's own (a graph replays fixed arguments, so it
// cannot walk the ring), then every launch in the eager order with the eager arguments but
// that pair. From then on a step is the lr memsets of groups whose lr changed, then one
// cuGraphLaunch on the caller's stream. A new layout (groups rebuilt, a cache rebuilt, another
// seed) drops the graph, runs eagerly once and records again. Steps stay eager while the
// caller's stream is being captured, when the driver table lacks the graph calls, when
// EngineOptions::cuda_graph or LUMINAV_CUDA_GRAPH=0 turns graphs off, and after a recording
// the driver refused.
//
// HIP: no graph replay (the HIP table has no capture or graph calls), and no capture query: every
// step zeroes a flag pair of its own, as a step under capture does, so a step the caller
// captures with hipStreamBeginCapture replays correctly.
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/gpu_driver.h"
#include "engine/group_launch.h"

namespace luminav {
namespace engine_detail {

namespace {

CUdeviceptr dptr(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }
void* hptr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

// Flag pairs in the ring: one memset per kFlagSlots eager steps (2 KiB of device memory).
constexpr std::size_t kFlagSlots = 64;
// Each int32 flag on its own 16 bytes: a bundle kernel assumes every pointer argument is 16-byte
// aligned (docs/bundle-format.md). A pair is found_inf, then the non-skipping groups' flag.
constexpr std::size_t kFlagBytes = gpu::kAlignBytes;
constexpr std::size_t kFlagPairBytes = 2 * kFlagBytes;
constexpr std::size_t kCounterBytes = gpu::kAlignBytes;  // the applied-step counter (int64), padded

struct GroupCache {
  Device* device = nullptr;  // frees `buffers` when the group's rows are rebuilt
  std::uint64_t id = 0;      // unique per device: a graph recorded over this cache names it
  std::vector<CUdeviceptr> buffers;
  ~GroupCache() {
    // The launches go first; then the buffers they point at.
    probe.reset();
    launches.reset();
    for (CUdeviceptr p : buffers) device->release(hptr(p));
  }
  gpu::GroupBuffers buf;
  std::unique_ptr<GpuGroupLaunches> launches;  // the group's kernels, loaded and bound
  bool counts_applied = false;  // the table's last row is the engine's applied-step counter
  std::uint32_t lr_bits = 0;
  bool lr_written = false;
  std::vector<std::int32_t> host_block_map;  // for naming the offending tensor under 'raise'
  // nonfinite='raise': pass 1 as a skipping group runs it, to find a non-finite gradient.
  std::unique_ptr<GpuGroupLaunches> probe;
};

constexpr std::size_t kNoGroup = std::numeric_limits<std::size_t>::max();

// What the launches of a step are bound to, per group: a graph recorded over one layout
// replays only that layout.
struct LayoutEntry {
  std::uint64_t cache_id = 0;
  std::uint64_t seed = 0;
};

// LUMINAV_CUDA_GRAPH: unset, empty or "1" leaves graphs on, "0" turns them off.
bool graphs_allowed_by_environment() {
  const char* v = std::getenv("LUMINAV_CUDA_GRAPH");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  throw Error(Status::kInvalidArgument, std::string("LUMINAV_CUDA_GRAPH is \"") + v +
                                            "\"; set it to 0 (launch each kernel) or 1 (replay steps as CUDA graphs), "
                                            "or unset it");
}

class GpuDevice final : public Device {
 public:
  GpuDevice(std::unique_ptr<GpuDriver> driver, bool cuda_graph) : drv_(std::move(driver)) {
    graphs_ = cuda_graph && drv_->graphs_available() && graphs_allowed_by_environment();
    // [applied-step counter][capture flag pair][graph flag pair][ring of kFlagSlots flag
    // pairs], zeroed.
    flags_ = dptr(alloc(kCounterBytes + 2 * kFlagPairBytes + kFlagSlots * kFlagPairBytes));
    applied_ = flags_;
    capture_pair_ = flags_ + kCounterBytes;
    graph_pair_ = capture_pair_ + kFlagPairBytes;
    ring_ = graph_pair_ + kFlagPairBytes;
  }
  ~GpuDevice() override {
    try {
      GpuScope scope(*drv_);
      drv_->synchronize_quietly();
      drop_graph();
      drv_->free(flags_);
    } catch (...) {
    }
  }

  DeviceType type() const override { return drv_->type(); }

  void* alloc(std::size_t bytes) override {
    GpuScope scope(*drv_);
    const CUdeviceptr p = drv_->malloc(bytes);
    try {
      drv_->memset8_async(p, 0, bytes, nullptr, "zeroing a new allocation");
      drv_->synchronize("zeroing a new allocation");
    } catch (...) {
      drv_->free(p);
      throw;
    }
    return hptr(p);
  }
  void release(void* p) noexcept override {
    if (!p) return;
    try {
      GpuScope scope(*drv_);
      drv_->synchronize_quietly();
      drv_->free(dptr(p));
    } catch (...) {
    }
  }
  void to_host(void* dst, const void* src, std::size_t bytes) override {
    GpuScope scope(*drv_);
    drv_->synchronize("before reading device memory");
    drv_->copy_to_host(dst, dptr(src), bytes);
  }
  void from_host(void* dst, const void* src, std::size_t bytes) override {
    GpuScope scope(*drv_);
    drv_->synchronize("before writing device memory");
    drv_->copy_to_device(dptr(dst), src, bytes, "");
    drv_->synchronize("after writing device memory");
  }
  void copy(void* dst, const void* src, std::size_t bytes, void* stream) override {
    GpuScope scope(*drv_);
    drv_->copy_async(dptr(dst), dptr(src), bytes, stream);
  }

  void prepare(std::vector<LaunchGroup>& groups) override {
    if (caches_ready(groups)) return;  // the usual case: no driver call
    GpuScope scope(*drv_);
    prepare_caches(groups);
  }

  void check_nonfinite(std::vector<LaunchGroup>& groups, void* stream) override {
    GpuScope scope(*drv_);
    prepare_caches(groups);
    for (auto& g : groups) {
      if (g.cfg.hyper.nonfinite != NonFinite::kRaise || g.rows.empty()) continue;
      // Pass 1 without the sum (NEED_SUM = 0 when clip == 0), as a skipping group runs it; then
      // the partial flags on the host name the first offending tensor.
      GroupCache& c = *static_cast<GroupCache*>(g.cache.get());
      if (!c.probe) {
        GroupConfig probe = g.cfg;
        probe.hyper.nonfinite = NonFinite::kSkip;  // the variants a checking group runs
        c.probe = drv_->load_group(probe);
        c.probe->bind(c.buf, ring_, ring_ + kFlagBytes);
      }
      c.probe->set_seed(g.cfg.seed);
      c.probe->pass1(stream);
      drv_->stream_synchronize(stream, "nonfinite='raise' reads the flag on the host");
      std::vector<std::int32_t> bad(static_cast<std::size_t>(c.buf.nblocks));
      if (!bad.empty()) drv_->copy_to_host(bad.data(), c.buf.partial_bad, bad.size() * 4);
      for (std::size_t b = 0; b < bad.size(); ++b) {
        if (bad[b]) throw Error(Status::kNonFinite, nonfinite_message(g, static_cast<std::size_t>(c.host_block_map[b])));
      }
    }
  }

  void step(std::vector<LaunchGroup>& groups, void* stream) override {
    GpuScope scope(*drv_);
    const bool any_check = prepare_caches(groups) != kNoGroup;  // first step after a change: allocates, loads
    const bool capturing = drv_->may_be_capturing(stream);

    if (graphs_ && !capturing && !groups.empty()) {
      if (exec_ && !same_layout(groups, graph_layout_)) drop_graph();
      // The second step of a layout records it.
      if (!exec_ && same_layout(groups, eager_layout_)) record_graph(groups);
      if (exec_) {
        for (auto& g : groups) write_lr(g, stream);
        drv_->graph_launch(exec_, stream);
        if (any_check) ++checked_steps_;
        return;
      }
    }

    // This step's flag pair (see the top of the file).
    CUdeviceptr pair = 0;
    if (capturing) {
      drv_->memset32_async(capture_pair_, 0, kFlagPairBytes / 4, stream, "the step's flags");
      pair = capture_pair_;
    } else {
      if (ring_next_ == 0) {
        drv_->memset32_async(ring_, 0, kFlagSlots * kFlagPairBytes / 4, stream, "the step flags' ring");
      }
      pair = ring_ + ring_next_ * kFlagPairBytes;
      ring_next_ = (ring_next_ + 1) % kFlagSlots;
    }
    for (auto& g : groups) write_lr(g, stream);
    enqueue(groups, pair, stream);
    if (any_check) ++checked_steps_;
    if (graphs_ && !capturing && !same_layout(groups, eager_layout_)) set_layout(groups, eager_layout_);
  }

  std::int64_t skipped() override {
    std::int64_t applied = 0;
    to_host(&applied, hptr(applied_), 8);
    return checked_steps_ - applied;
  }
  void set_skipped(std::int64_t value) override {
    const std::int64_t zero = 0;
    from_host(hptr(applied_), &zero, 8);
    checked_steps_ = value;
  }

 private:
  // The group's lr as a device float32: a memset on `stream` only when its bits changed.
  void write_lr(LaunchGroup& g, void* stream) {
    GroupCache& c = *static_cast<GroupCache*>(g.cache.get());
    std::uint32_t bits;
    std::memcpy(&bits, &g.lr, 4);
    if (c.lr_written && bits == c.lr_bits) return;
    drv_->memset32_async(c.buf.lr, bits, 1, stream, "lr");
    c.lr_bits = bits;
    c.lr_written = true;
  }

  // The launches of a step on `stream`, every group's flags at `pair` (zeroed before them in
  // stream order): pass 1 and reduce where needed, pass 2, commit.
  void enqueue(std::vector<LaunchGroup>& groups, CUdeviceptr pair, void* stream) {
    const CUdeviceptr found_inf = pair, other_flag = pair + kFlagBytes;
    for (auto& g : groups) {
      GroupCache& c = *static_cast<GroupCache*>(g.cache.get());
      c.launches->set_flags(found_inf, g.cfg.check_flag() ? found_inf : other_flag);
      c.launches->set_seed(g.cfg.seed);
    }
    for (auto& g : groups) {
      GroupCache& c = *static_cast<GroupCache*>(g.cache.get());
      if (!c.launches->has_pass1()) continue;
      c.launches->pass1(stream);
      c.launches->reduce(stream);
    }
    for (auto& g : groups) static_cast<GroupCache*>(g.cache.get())->launches->update(stream);
    for (auto& g : groups) static_cast<GroupCache*>(g.cache.get())->launches->commit(stream);
  }

  static bool same_layout(const std::vector<LaunchGroup>& groups, const std::vector<LayoutEntry>& layout) {
    if (groups.size() != layout.size()) return false;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const auto* c = static_cast<const GroupCache*>(groups[i].cache.get());
      if (c->id != layout[i].cache_id || groups[i].cfg.seed != layout[i].seed) return false;
    }
    return true;
  }
  static void set_layout(const std::vector<LaunchGroup>& groups, std::vector<LayoutEntry>& layout) {
    layout.clear();
    for (const LaunchGroup& g : groups) layout.push_back({static_cast<const GroupCache*>(g.cache.get())->id, g.cfg.seed});
  }

  void drop_graph() noexcept {
    if (exec_) drv_->graph_destroy(exec_);
    exec_ = nullptr;
    graph_layout_.clear();
  }

  // Records the step's launches into exec_ by capturing them on the private stream (nothing
  // runs there). Where the driver refuses any part, graphs stay off for this device and the
  // step runs eagerly; a launch that cannot be enqueued then reports its own error.
  void record_graph(std::vector<LaunchGroup>& groups) {
    void* stream = drv_->begin_capture();
    if (stream == nullptr) {
      graphs_ = false;
      return;
    }
    bool enqueued = true;
    try {
      drv_->memset32_async(graph_pair_, 0, kFlagPairBytes / 4, stream, "the graph's flags");
      enqueue(groups, graph_pair_, stream);
    } catch (...) {
      enqueued = false;
    }
    void* exec = drv_->end_capture(stream, enqueued);
    if (exec == nullptr) {
      graphs_ = false;
      return;
    }
    exec_ = exec;
    set_layout(groups, graph_layout_);
  }

  // True when every group's cache is built as prepare_caches would build it.
  static bool caches_ready(const std::vector<LaunchGroup>& groups) {
    bool counting_seen = false;
    for (const LaunchGroup& g : groups) {
      const bool counts = !counting_seen && g.cfg.check_flag();
      counting_seen = counting_seen || counts;
      if (!g.cache || static_cast<const GroupCache*>(g.cache.get())->counts_applied != counts) return false;
    }
    return true;
  }

  // Builds what each group lacks (tables, kernels, bound launches); the primary context must be
  // current. Returns the index of the group that counts applied steps (the first that skips
  // on non-finite gradients), or kNoGroup.
  std::size_t prepare_caches(std::vector<LaunchGroup>& groups) {
    std::size_t counting = kNoGroup;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (counting == kNoGroup && groups[i].cfg.check_flag()) counting = i;
      LaunchGroup& g = groups[i];
      const bool counts = i == counting;
      if (g.cache && static_cast<GroupCache*>(g.cache.get())->counts_applied == counts) continue;
      g.cache.reset();
      g.cache = build_cache(g, counts);
    }
    return counting;
  }

  std::shared_ptr<GroupCache> build_cache(const LaunchGroup& g, bool counts_applied) {
    auto c = std::make_shared<GroupCache>();
    c->device = this;
    c->id = ++next_cache_id_;
    // Loads (and verifies) every kernel the group runs before anything is allocated.
    c->launches = drv_->load_group(g.cfg);
    const std::size_t n = g.rows.size();
    if (n + 1 > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      throw Error(Status::kInvalidArgument, "a launch group of " + std::to_string(n) +
                                                " tensors is more than the kernels' int32 count takes; split the "
                                                "parameters over groups");
    }
    gpu::HostTables t = gpu::build_tables(g.rows.data(), n);
    if (counts_applied) {
      // The applied-step counter's row: no elements, no programs; commit advances its STEP.
      const std::size_t row = t.table.size();
      t.table.resize(row + gpu::kTableCols, 0);
      t.table[row + gpu::kColStep] = static_cast<std::int64_t>(applied_);
    }
    c->counts_applied = counts_applied;
    c->host_block_map = t.block_map;
    auto grab = [&](std::size_t bytes) {
      CUdeviceptr p = dptr(alloc(bytes < gpu::kAlignBytes ? gpu::kAlignBytes : bytes));
      c->buffers.push_back(p);
      return p;
    };
    const std::size_t nb = static_cast<std::size_t>(t.nblocks);
    gpu::GroupBuffers& b = c->buf;
    b.table = grab(t.table.size() * 8);
    b.block_map = grab(nb * 4);
    b.partial_sum = grab(nb * 4);
    b.partial_bad = grab(nb * 4);
    b.stats = grab(n * 4);
    b.lr = grab(4);
    b.nblocks = t.nblocks;
    b.ntensors = static_cast<std::int32_t>(n);
    b.commit_rows = static_cast<std::int32_t>(n + (counts_applied ? 1 : 0));
    if (!t.table.empty()) drv_->copy_to_device(b.table, t.table.data(), t.table.size() * 8, "table");
    if (nb) drv_->copy_to_device(b.block_map, t.block_map.data(), nb * 4, "block_map");
    c->launches->bind(b, ring_, ring_ + kFlagBytes);
    return c;
  }

  std::unique_ptr<GpuDriver> drv_;
  CUdeviceptr flags_ = 0, applied_ = 0, capture_pair_ = 0, graph_pair_ = 0, ring_ = 0;
  std::size_t ring_next_ = 0;  // the ring's next unused pair; 0: the ring is zeroed first
  std::int64_t checked_steps_ = 0;
  std::uint64_t next_cache_id_ = 0;
  // Graph replay (see the top of the file).
  bool graphs_ = false;
  void* exec_ = nullptr;  // the vendor's executable graph
  std::vector<LayoutEntry> graph_layout_;  // what exec_ replays
  std::vector<LayoutEntry> eager_layout_;  // the layout of the last eager step
};

}  // namespace

void GpuDriver::graph_launch(void* exec, void* stream) {
  (void)exec;
  (void)stream;
  throw Error(Status::kInternal, "graph_launch on a driver without graphs");
}

std::unique_ptr<Device> make_cuda_device(int device_index, const std::string& bundle_dir, bool cuda_graph) {
  return std::make_unique<GpuDevice>(make_cuda_gpu_driver(device_index, bundle_dir), cuda_graph);
}

std::unique_ptr<Device> make_hip_device(int device_index, const std::string& bundle_dir, const std::string& arch) {
  return std::make_unique<GpuDevice>(make_hip_gpu_driver(device_index, bundle_dir, arch), false);
}

}  // namespace engine_detail
}  // namespace luminav

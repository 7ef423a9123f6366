// tests/fakes/fake_cuda_device.cpp: the fake CUDA device and its fixture (see fake_cuda_device.h)
#include "fakes/fake_cuda_device.h"

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include "aot/triton_abi.h"
#include "engine/group_launch.h"

using luminav::CUdeviceptr;
using luminav::CUresult;
using luminav::CUstream;
using luminav::Engine;
using luminav::EngineOptions;
using luminav::GroupConfig;
using luminav::Hyper;
using luminav::NonFinite;
using luminav::ParamDesc;

namespace luminav_test {

const char* const kKinds[6] = {"pass1", "reduce", "pass2", "single_pass", "commit", "commit"};

FakeDevice& dev() {
  static FakeDevice d;
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
      *static_cast<std::int64_t*>(at(static_cast<CUdeviceptr>(table[r * luminav::gpu::kTableCols + 5]  /* STEP */))) += 1 - found_inf;
    }
  }
  dev().launches.push_back(l);
}
CUresult launch(CUfunction f, unsigned gx, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream stream,
                void** params, void**) {
  for (std::size_t i = 0; i < std::size(kKinds); ++i) {
    if (f != fake_function(i)) continue;
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

Hyper clip_skip() {
  Hyper h;
  h.clip = 4.0;
  h.nonfinite = NonFinite::kSkip;
  return h;
}

void CudaDeviceTest::SetUp() {
  FakeDriverFixture::SetUp();
  dev() = FakeDevice{};
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

void CudaDeviceTest::write_bundle(const std::vector<GroupConfig>& cfgs) {
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

GroupConfig CudaDeviceTest::config(const Hyper& h) {
  GroupConfig c;
  c.hyper = h;
  c.state_dtype = h.state_dtype;
  return c;
}

void CudaDeviceTest::install_graphs() {
  api_.cuStreamBeginCapture = fake_mem::begin_capture;
  api_.cuStreamEndCapture = fake_mem::end_capture;
  api_.cuGraphInstantiateWithFlags = fake_mem::instantiate;
  api_.cuGraphLaunch = fake_mem::graph_launch;
  api_.cuGraphDestroy = fake_mem::graph_destroy;
  api_.cuGraphExecDestroy = fake_mem::exec_destroy;
}

std::unique_ptr<Engine> CudaDeviceTest::engine(std::uint64_t seed, bool cuda_graph) {
  EngineOptions o;
  o.device = luminav::DeviceType::kCuda;
  o.bundle_dir = dir_.path();
  o.seed = seed;
  o.cuda_graph = cuda_graph;
  return std::make_unique<Engine>(o);
}

std::size_t CudaDeviceTest::add_group(Engine& e, const Hyper& h, const std::vector<std::int64_t>& numels) {
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

std::vector<std::int64_t> CudaDeviceTest::table(const Launch& l, std::size_t rows) {
  std::vector<std::int64_t> t(rows * luminav::gpu::kTableCols);
  std::memcpy(t.data(), fake_mem::at(l.args[kTable]), t.size() * 8);
  return t;
}

std::vector<std::string> CudaDeviceTest::kinds(const std::vector<Launch>& ls) {
  std::vector<std::string> k;
  for (const Launch& l : ls) k.push_back(l.kind);
  return k;
}

}  // namespace luminav_test

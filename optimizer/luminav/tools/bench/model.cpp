// tools/bench/model.cpp: the model `luminav bench` steps (uniform tensors or GPT-2 small's), and
// its params and grads filled from a host RNG, in host or device memory
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "common/cli_args.h"
#include "engine/cpu_kernels.h"

namespace luminav {
namespace tools {
namespace bench {

namespace {

// GPT-2 small (124M): wte, wpe, 12 blocks of 12 tensors, ln_f (benchmarks/bench_step.py).
std::vector<std::int64_t> gpt2_124m_numels() {
  const std::int64_t d = 768, vocab = 50257, ctx = 1024;
  std::vector<std::int64_t> n = {vocab * d, ctx * d};
  for (int block = 0; block < 12; ++block) {
    const std::int64_t layer[] = {d, d, d * 3 * d, 3 * d, d * d, d,          // ln_1, attn
                                  d, d, d * 4 * d, 4 * d, 4 * d * d, d};     // ln_2, mlp
    n.insert(n.end(), std::begin(layer), std::end(layer));
  }
  n.push_back(d);
  n.push_back(d);
  return n;
}

// Fills elements [first, first + count) of a tensor with uniform values in [-scale, scale):
// element i gets splitmix64(key + i), so any chunking of the fill gives the same values.
void fill_random(unsigned char* out, DType d, std::uint64_t key, std::int64_t first, std::int64_t count, float scale) {
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint64_t r = cpu::splitmix64(key + static_cast<std::uint64_t>(first + i));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    const float x = scale * (2.0f * u - 1.0f);
    if (d == DType::kFloat32) {
      std::memcpy(out + i * 4, &x, 4);
    } else {
      const std::uint16_t h = cpu::float_to_bf16_rne(x);
      std::memcpy(out + i * 2, &h, 2);
    }
  }
}

// The fill's scales: params like a transformer's initialisation, grads small and finite.
constexpr float kParamScale = 0.035f;  // uniform: std 0.02
constexpr float kGradScale = 1.7e-3f;  // uniform: std 1e-3

}  // namespace

Model make_model(const BenchOptions& o) {
  Model m;
  if (o.shapes == "gpt2") {
    const std::vector<std::int64_t> all = gpt2_124m_numels();
    const auto n = static_cast<std::int64_t>(all.size());
    if (o.groups > n) {
      throw UsageError{"--shapes gpt2 has " + std::to_string(n) + " tensors; --groups must be at most that, got " +
                       std::to_string(o.groups)};
    }
    for (std::int64_t g = 0; g < o.groups; ++g) {
      m.groups.emplace_back(all.begin() + g * n / o.groups, all.begin() + (g + 1) * n / o.groups);
    }
  } else {
    m.groups.assign(static_cast<std::size_t>(o.groups), std::vector<std::int64_t>(static_cast<std::size_t>(o.tensors), o.numel));
  }
  for (const auto& g : m.groups) {
    m.tensors += static_cast<std::int64_t>(g.size());
    for (std::int64_t n : g) m.elements += n;
  }
  return m;
}

void* HostStorage::make(DType d, std::int64_t numel, std::uint64_t key, float scale) {
  blocks_.emplace_back(new unsigned char[static_cast<std::size_t>(numel) * dtype_size(d)]);
  fill_random(blocks_.back().get(), d, key, 0, numel, scale);
  return blocks_.back().get();
}

void* DeviceStorage::make(DType d, std::int64_t numel, std::uint64_t key, float scale) {
  const std::size_t bytes = static_cast<std::size_t>(numel) * dtype_size(d);
  const CUdeviceptr p =
      session_.alloc(bytes, "allocating " + std::to_string(bytes) + " bytes for a benchmark tensor; make the model smaller");
  // Filled and uploaded in chunks: the host never holds more than one chunk.
  constexpr std::int64_t kChunk = std::int64_t{1} << 22;
  host_.resize(static_cast<std::size_t>(std::min(numel, kChunk)) * dtype_size(d));
  for (std::int64_t first = 0; first < numel; first += kChunk) {
    const std::int64_t count = std::min(kChunk, numel - first);
    fill_random(host_.data(), d, key, first, count, scale);
    session_.write(p + static_cast<CUdeviceptr>(first) * dtype_size(d), host_.data(),
                   static_cast<std::size_t>(count) * dtype_size(d));
  }
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
}

ModelData make_data(Storage& storage, const Model& model, const BenchOptions& o) {
  ModelData data;
  std::uint64_t k = 0;
  for (const auto& group : model.groups) {
    data.emplace_back();
    for (std::int64_t numel : group) {
      ParamDesc d;
      d.dtype = o.dtype;
      d.grad_dtype = o.dtype;
      d.numel = numel;
      d.data = storage.make(o.dtype, numel, (2 * k) << 40, kParamScale);
      d.grad = storage.make(o.dtype, numel, (2 * k + 1) << 40, kGradScale);
      data.back().push_back(d);
      ++k;
    }
  }
  return data;
}

void add_params(Engine& engine, const ModelData& data, const Hyper& h) {
  for (const auto& group : data) {
    const std::size_t g = engine.add_group(h);
    for (const ParamDesc& d : group) engine.add_param(g, d);
  }
}

Hyper make_hyper(const BenchOptions& o) {
  Hyper h;  // lr, betas, eps, weight decay: the spec's defaults
  h.clip = o.clip;
  h.nonfinite = o.nonfinite;
  h.bound_mode = o.bound;
  h.state_dtype = o.state_dtype;
  return h;
}

}  // namespace bench
}  // namespace tools
}  // namespace luminav

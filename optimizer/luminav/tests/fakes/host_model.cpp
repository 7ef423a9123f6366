// tests/fakes/host_model.cpp: the host-memory test model and its CPU engine (see host_model.h)
#include "fakes/host_model.h"

#include <cmath>
#include <random>

#include "engine/cpu_kernels.h"

using luminav::DType;
using luminav::Engine;
using luminav::EngineOptions;
using luminav::Hyper;
using luminav::ParamDesc;

namespace luminav_test {

Model Model::make(const std::vector<std::int64_t>& sizes, DType dtype, std::uint32_t seed) {
  Model m;
  m.dtype = dtype;
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::int64_t n : sizes) {
    std::vector<float> p(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n));
    for (auto& x : p) x = nd(gen);
    for (auto& x : g) x = nd(gen) * 0.1f;
    m.grads.push_back(g);
    if (dtype == DType::kFloat32) {
      m.f32.push_back(p);
    } else {
      std::vector<std::uint16_t> h(p.size());
      for (std::size_t i = 0; i < p.size(); ++i)
        h[i] = dtype == DType::kBFloat16 ? luminav::cpu::float_to_bf16_rne(p[i]) : luminav::cpu::float_to_f16_rne(p[i]);
      m.half.push_back(h);
    }
  }
  return m;
}

void* Model::data(std::size_t j) { return dtype == DType::kFloat32 ? static_cast<void*>(f32[j].data()) : half[j].data(); }

std::vector<std::uint8_t> Model::bytes() const {
  std::vector<std::uint8_t> out;
  for (std::size_t j = 0; j < size(); ++j) {
    const std::uint8_t* b = dtype == DType::kFloat32 ? reinterpret_cast<const std::uint8_t*>(f32[j].data())
                                                     : reinterpret_cast<const std::uint8_t*>(half[j].data());
    out.insert(out.end(), b, b + grads[j].size() * (dtype == DType::kFloat32 ? 4 : 2));
  }
  return out;
}

void Model::perturb_grads(int step) {
  for (auto& g : grads)
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.37f * static_cast<float>(i + 1) * static_cast<float>(step + 1)) * 0.05f;
}

std::unique_ptr<Engine> make_engine(Model& m, const Hyper& h, int threads, std::uint64_t seed) {
  EngineOptions o;
  o.num_threads = threads;
  o.seed = seed;
  auto e = std::make_unique<Engine>(o);
  const std::size_t g = e->add_group(h);
  for (std::size_t j = 0; j < m.size(); ++j) {
    ParamDesc d;
    d.data = m.data(j);
    d.dtype = m.dtype;
    d.grad = m.grads[j].data();
    d.grad_dtype = DType::kFloat32;
    d.numel = static_cast<std::int64_t>(m.grads[j].size());
    e->add_param(g, d);
  }
  return e;
}

}  // namespace luminav_test

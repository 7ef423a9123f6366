// tests/fakes/host_model.h: a test model in host memory (params of one dtype, float32 grads) and
// a CPU engine over it, for the tests of the engine and of its state export
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"

namespace luminav_test {

// Tensors of one test model: params (as raw bytes of their dtype) and float32 grads.
struct Model {
  luminav::DType dtype = luminav::DType::kFloat32;
  std::vector<std::vector<std::uint16_t>> half;  // bf16/f16 params
  std::vector<std::vector<float>> f32;           // f32 params
  std::vector<std::vector<float>> grads;

  // Params from N(0, 1) and grads from N(0, 0.1) of a generator seeded with `seed`.
  static Model make(const std::vector<std::int64_t>& sizes, luminav::DType dtype, std::uint32_t seed);
  void* data(std::size_t j);
  std::size_t size() const { return grads.size(); }
  // Every param's bytes, in order.
  std::vector<std::uint8_t> bytes() const;
  // Deterministic new gradients for `step`.
  void perturb_grads(int step);
};

// A CPU engine of `threads` workers with one group of hyperparameters `h` holding every tensor
// of `m` (float32 grads), its state allocated by the engine.
std::unique_ptr<luminav::Engine> make_engine(Model& m, const luminav::Hyper& h, int threads,
                                             std::uint64_t seed = 1234);

}  // namespace luminav_test

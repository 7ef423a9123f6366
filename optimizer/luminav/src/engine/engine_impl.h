// src/engine/engine_impl.h: the state behind an Engine (its groups, parameters, step counters and
// launch groups), shared by engine.cpp (building and stepping) and state_io.cpp (export/import)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/device.h"
#include "engine/engine.h"

namespace luminav {

struct Engine::Impl {
  struct Param {
    std::size_t group = 0;
    ParamDesc desc;
    void* m = nullptr;
    void* v = nullptr;
    void* p0 = nullptr;
    float* sm = nullptr;  // q8: the block scales of m and v, and the block row's elements
    float* sv = nullptr;
    std::int64_t row_len = 0;
    bool own_m = false, own_v = false, own_p0 = false, own_sm = false, own_sv = false;
    bool p0_ready = false;
  };
  struct Group {
    Hyper hyper;
    std::vector<std::size_t> params;
  };

  EngineOptions options;
  std::unique_ptr<engine_detail::Device> device;
  std::uint64_t seed = 0;
  std::vector<Group> groups;
  std::vector<Param> params;
  std::int64_t* steps = nullptr;  // device array of int64 counters, one per parameter
  std::size_t steps_capacity = 0;
  std::vector<engine_detail::LaunchGroup> launch;
  bool dirty = true;

  ~Impl();

  // Throw Error(kInvalidArgument) naming the index and the count for one out of range.
  Param& param(std::size_t k);
  Group& group(std::size_t g);
  // Grows the step-counter array, keeping its values.
  void reserve_steps(std::size_t n);
  // The launch groups of the next step (docs/internals.md "One step", 1. Plan).
  void rebuild();
};

}  // namespace luminav

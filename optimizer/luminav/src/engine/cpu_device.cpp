// src/engine/cpu_device.cpp: the engine's CPU device: host memory, and a step as the passes of
// cpu_kernels.cpp on a thread pool
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/device.h"
#include "engine/thread_pool.h"

namespace luminav {
namespace engine_detail {

namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int num_threads) : pool_(cpu::make_thread_pool(num_threads)) {}
  DeviceType type() const override { return DeviceType::kCpu; }
  int num_threads() const override { return pool_->size(); }
  void* alloc(std::size_t bytes) override {
    void* p = ::operator new(bytes);
    std::memset(p, 0, bytes);
    return p;
  }
  void release(void* p) noexcept override { ::operator delete(p); }
  void to_host(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void from_host(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes, void*) override { std::memcpy(dst, src, bytes); }

  void check_nonfinite(std::vector<LaunchGroup>& groups, void*) override {
    for (auto& g : groups) {
      if (g.cfg.hyper.nonfinite != NonFinite::kRaise) continue;
      const std::int64_t bad = cpu::first_nonfinite(g.cfg, g.rows.data(), g.rows.size(), *pool_);
      if (bad >= 0) throw Error(Status::kNonFinite, nonfinite_message(g, static_cast<std::size_t>(bad)));
    }
  }

  void step(std::vector<LaunchGroup>& groups, void*) override {
    std::int32_t found_inf = 0;
    std::vector<std::vector<float>> stats(groups.size());
    if (caches_.size() != groups.size()) caches_.resize(groups.size());
    for (std::size_t i = 0; i < groups.size(); ++i) {
      auto& g = groups[i];
      if (!g.cfg.needs_pass1()) continue;
      stats[i].assign(g.rows.size(), 0.0f);
      cpu::pass1(g.cfg, g.rows.data(), g.rows.size(), stats[i].data(), &found_inf, *pool_, &caches_[i]);
    }
    for (std::size_t i = 0; i < groups.size(); ++i) {
      auto& g = groups[i];
      cpu::pass2(g.cfg, g.rows.data(), g.rows.size(), g.lr, stats[i].empty() ? nullptr : stats[i].data(),
                 &found_inf, *pool_, &caches_[i]);
    }
    for (auto& g : groups) cpu::commit(g.cfg, g.rows.data(), g.rows.size(), &found_inf);
    skipped_ += found_inf;
  }
  std::int64_t skipped() override { return skipped_; }
  void set_skipped(std::int64_t value) override { skipped_ = value; }

 private:
  std::shared_ptr<cpu::ThreadPool> pool_;
  std::vector<cpu::DirectionCache> caches_;  // one per launch group: pass 1's u for pass 2
  std::int64_t skipped_ = 0;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int num_threads) { return std::make_unique<CpuDevice>(num_threads); }

}  // namespace engine_detail
}  // namespace luminav

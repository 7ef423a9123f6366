// tools/bench/bench.h: the parts of `luminav bench` (run in bench.cpp): its options
// (options.cpp), its model and where its tensors live (model.cpp), and its report (report.cpp)
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda_session.h"
#include "engine/engine.h"
#include "luminav/cuda_driver.h"

namespace luminav {
namespace tools {
namespace bench {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Options (options.cpp)

// The option list `luminav bench --help` prints.
extern const char* const kBenchUsage;

constexpr std::int64_t kMaxElements = std::int64_t{1} << 44;  // 16 Ti elements: beyond any device

struct BenchOptions {
  std::string bundle;  // empty for "-"
  DeviceType device = DeviceType::kCpu;
  int device_index = 0;
  int groups = 1;
  int tensors = 8;
  std::int64_t numel = std::int64_t{1} << 20;
  std::string shapes;  // "" or "gpt2"
  DType dtype = DType::kFloat32;
  DType state_dtype = DType::kFloat32;
  double clip = 4.0;
  NonFinite nonfinite = NonFinite::kSkip;
  BoundMode bound = BoundMode::kNone;
  int steps = 100;
  int warmup = 10;
  int threads = 0;
  std::string csv;
};

// Throws UsageError naming the option for anything it does not take.
BenchOptions parse_bench_options(const std::vector<std::string>& args);

// ---------------------------------------------------------------------------------------------
// The model and its tensors (model.cpp)

struct Model {
  std::vector<std::vector<std::int64_t>> groups;  // numel of each tensor of each group
  std::int64_t tensors = 0;
  std::int64_t elements = 0;
};
// G groups of T tensors of N elements, or GPT-2 small's 148 tensors split into G groups.
Model make_model(const BenchOptions& o);

// Where the benchmark's params and grads live.
class Storage {
 public:
  virtual ~Storage() = default;
  // `numel` elements of `d`, filled by fill_random(key, scale); returns the engine's address.
  virtual void* make(DType d, std::int64_t numel, std::uint64_t key, float scale) = 0;
};

class HostStorage final : public Storage {
 public:
  void* make(DType d, std::int64_t numel, std::uint64_t key, float scale) override;

 private:
  std::vector<std::unique_ptr<unsigned char[]>> blocks_;
};

// Device buffers of a CUDA session, filled and uploaded in chunks (the host never holds more
// than one chunk).
class DeviceStorage final : public Storage {
 public:
  explicit DeviceStorage(CudaSession& session) : session_(session) {}
  void* make(DType d, std::int64_t numel, std::uint64_t key, float scale) override;

 private:
  CudaSession& session_;
  std::vector<unsigned char> host_;
};

using ModelData = std::vector<std::vector<ParamDesc>>;  // per group, per tensor

// Params and grads of every tensor, filled, in `storage`. Tensor k's param and grad are the
// random streams 2k and 2k + 1.
ModelData make_data(Storage& storage, const Model& model, const BenchOptions& o);
// One param group of `h` per model group.
void add_params(Engine& engine, const ModelData& data, const Hyper& h);
// lr, betas, eps, weight decay: the spec's defaults; the rest from the options.
Hyper make_hyper(const BenchOptions& o);

// ---------------------------------------------------------------------------------------------
// Results and the report (report.cpp)

struct Phase {
  std::string name;
  Clock::time_point end;
  bool is_data = false;
};

struct Results {
  std::string device_name, driver;
  int threads = 0;            // CPU engine worker threads (0 on CUDA)
  std::vector<Phase> phases;  // cold start, in order; the last one ends at the first finished step
  double host_us_mean = 0, host_us_median = 0, host_us_max = 0;
  double device_us = std::numeric_limits<double>::quiet_NaN();
  double launches_per_step = std::numeric_limits<double>::quiet_NaN();        // cuLaunchKernel
  double graph_launches_per_step = std::numeric_limits<double>::quiet_NaN();  // cuGraphLaunch
  double blocking_per_step = std::numeric_limits<double>::quiet_NaN();
  std::string blocking_detail;  // the timed steps' blocking calls, by name
  std::string first_step_calls;  // the first step's driver work, by name
};

struct ColdStart {
  double total_ms = 0;      // main() to the first finished step
  double data_ms = 0;       // of which the benchmark's own data fill
  std::optional<double> start_to_main_ms;
};
ColdStart cold_start(const Results& r, Clock::time_point main_start);

void print_report(const BenchOptions& o, const Model& model, const Results& r, const ColdStart& c,
                  Clock::time_point main_start);

// Checked before anything runs, so a run never ends with results it cannot keep: throws
// Error(kInvalidArgument) for a file that holds other columns or cannot be appended to.
// Returns whether the header must be written.
bool check_csv(const std::string& path);
// Appends the run's row (and the header first when `header`) to o.csv.
void append_csv(const BenchOptions& o, const Model& model, const Results& r, const ColdStart& c,
                Clock::time_point main_start, bool header);

// "NVIDIA H200" (or "CUDA device N" where the driver cannot say); the CPU's model name.
std::string cuda_device_name(const CudaDriverApi& real, CUdevice device, int ordinal);
std::string cpu_name();

}  // namespace bench
}  // namespace tools
}  // namespace luminav

// luminav bench: how long the engine takes to come up, and how much host time a step costs.
//
//   luminav bench BUNDLE|- [--device cuda|cpu] [--device-index N] [--groups G] [--tensors T]
//                 [--numel N | --shapes gpt2] [--dtype fp32|bf16] [--state-dtype fp32|bf16]
//                 [--clip C] [--nonfinite skip|propagate] [--bound none|abs|rel]
//                 [--steps S] [--warmup W] [--threads N] [--csv FILE]
//
// The model: G param groups of T tensors of N elements each (or GPT-2 small's 148 tensors,
// split into G contiguous groups), params and grads of --dtype, moments of --state-dtype, filled
// from a host RNG. On CUDA they live in device memory (cuMemAlloc + cuMemcpyHtoD), on the CPU in
// host memory. The engine is luminav::Engine (engine.h), the object every other API wraps.
//
// Reported:
// - cold start: steady_clock from main()'s first statement to the first step finished (driver
//   loaded, context up, data uploaded, engine created with its bundle, params added, step()
//   returned and the stream synchronised), phase by phase; also without the data fill (the RNG
//   is the benchmark's, not the optimizer's), and the delay from the process's start to main()
//   (/proc/self/stat starttime, in clock ticks: about 10 ms resolution).
// - host time per step: steady_clock around each step() with no sync in between, averaged over
//   S steps after W warm-up steps; the stream is synchronised only after the batch. Device time
//   per step: two CUDA events around the same batch, divided by S. On the CPU, step() is
//   synchronous and its wall time is the step time.
// - driver calls: the CUDA path runs through a counting copy of the driver table
//   (ScopedDriverOverride), so the report gives the launches per step and every synchronising
//   or allocating driver call a timed step made. The engine promises none once the first step
//   has built its tables (nonfinite='raise' reads a flag on the host; bench does not offer it).
// Exit codes: 0 done, 1 failure, 2 usage, as the other subcommands.
#include "bench/bench.h"
#include "common/cli_args.h"

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "luminav/cuda_driver.h"
#include "engine/cpu_kernels.h"
#include "engine/engine.h"
#include "luminav/error.h"

namespace luminav {
namespace tools {

const char* const kBenchUsage =
    "usage: luminav bench BUNDLE|- [options]\n"
    "  Cold start (main() to the first finished step) and host time per step of the engine.\n"
    "  BUNDLE is an AOT bundle folder (luminamoon aot build); \"-\" for none (CPU only).\n"
    "  --device cuda|cpu          default: cuda with a BUNDLE, cpu with \"-\"\n"
    "  --device-index N           CUDA device ordinal (default 0)\n"
    "  --groups G                 param groups (default 1)\n"
    "  --tensors T                tensors per group (default 8)\n"
    "  --numel N                  elements per tensor (default 1048576)\n"
    "  --shapes gpt2              GPT-2 small's 148 tensors (124.4M elements) split into G groups,\n"
    "                             instead of --tensors/--numel\n"
    "  --dtype fp32|bf16          params and grads (default fp32)\n"
    "  --state-dtype fp32|bf16    moments (default fp32)\n"
    "  --clip C                   soft-clip threshold, 0 = off (default 4)\n"
    "  --nonfinite skip|propagate (default skip)\n"
    "  --bound none|abs|rel       (default none)\n"
    "  --steps S                  timed steps (default 100)\n"
    "  --warmup W                 untimed steps after the first one (default 10)\n"
    "  --threads N                CPU engine worker threads, 0 = one per hardware thread\n"
    "  --csv FILE                 append one row (device, driver, sizes, dtypes, times)\n";

namespace {

using Clock = std::chrono::steady_clock;

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

double parse_clip(const std::string& flag, const std::string& value) {
  try {
    std::size_t used = 0;
    const double v = std::stod(value, &used);
    if (used != value.size() || !std::isfinite(v) || v < 0) throw std::out_of_range("range");
    return v;
  } catch (const std::exception&) {
    throw UsageError{flag + " takes a finite number >= 0 (0 turns clipping off), got \"" + value + "\""};
  }
}

DType parse_dtype(const std::string& flag, const std::string& value) {
  if (value == "fp32" || value == "float32") return DType::kFloat32;
  if (value == "bf16" || value == "bfloat16") return DType::kBFloat16;
  throw UsageError{flag + " takes fp32 or bf16, got \"" + value + "\""};
}

BenchOptions parse_bench_options(const std::vector<std::string>& args) {
  BenchOptions o;
  bool have_bundle = false, have_device = false, have_tensors = false, have_numel = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UsageError{a + " needs a value"};
      return args[++i];
    };
    if (a == "--device") {
      const std::string v = value();
      if (v == "cuda") o.device = DeviceType::kCuda;
      else if (v == "cpu") o.device = DeviceType::kCpu;
      else throw UsageError{"--device takes cuda or cpu, got \"" + v + "\""};
      have_device = true;
    } else if (a == "--device-index") {
      o.device_index = static_cast<int>(parse_int(a, value(), 0, 65535));
    } else if (a == "--groups") {
      o.groups = static_cast<int>(parse_int(a, value(), 1, 65536));
    } else if (a == "--tensors") {
      o.tensors = static_cast<int>(parse_int(a, value(), 1, 1 << 20));
      have_tensors = true;
    } else if (a == "--numel") {
      o.numel = parse_int(a, value(), 1, kMaxElements);
      have_numel = true;
    } else if (a == "--shapes") {
      o.shapes = value();
      if (o.shapes != "gpt2") throw UsageError{"--shapes takes gpt2, got \"" + o.shapes + "\""};
    } else if (a == "--dtype") {
      o.dtype = parse_dtype(a, value());
    } else if (a == "--state-dtype") {
      o.state_dtype = parse_dtype(a, value());
    } else if (a == "--clip") {
      o.clip = parse_clip(a, value());
    } else if (a == "--nonfinite") {
      const std::string v = value();
      if (v == "skip") o.nonfinite = NonFinite::kSkip;
      else if (v == "propagate") o.nonfinite = NonFinite::kPropagate;
      else throw UsageError{"--nonfinite takes skip or propagate, got \"" + v + "\" ('raise' syncs with the host every step)"};
    } else if (a == "--bound") {
      const std::string v = value();
      if (v == "none") o.bound = BoundMode::kNone;
      else if (v == "abs") o.bound = BoundMode::kAbs;
      else if (v == "rel") o.bound = BoundMode::kRel;
      else throw UsageError{"--bound takes none, abs or rel, got \"" + v + "\""};
    } else if (a == "--steps") {
      o.steps = static_cast<int>(parse_int(a, value(), 1, 10000000));
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(parse_int(a, value(), 0, 10000000));
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_int(a, value(), 0, 4096));
    } else if (a == "--csv") {
      o.csv = value();
      if (o.csv.empty()) throw UsageError{"--csv needs a file name"};
    } else if (a == "-") {
      if (have_bundle) throw UsageError{"unexpected argument \"-\": BUNDLE was already given"};
      have_bundle = true;
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError{"unknown option " + a};
    } else if (!have_bundle) {
      o.bundle = a;
      have_bundle = true;
    } else {
      throw UsageError{"unexpected argument \"" + a + "\""};
    }
  }
  if (!have_bundle) throw UsageError{"missing BUNDLE (a folder with manifest.json, or \"-\" for the CPU engine)"};
  if (!have_device) o.device = o.bundle.empty() ? DeviceType::kCpu : DeviceType::kCuda;
  if (o.device == DeviceType::kCuda && o.bundle.empty()) {
    throw UsageError{"--device cuda needs a BUNDLE folder; build one with `luminamoon aot build --arch <major><minor> "
                     "--out DIR`"};
  }
  if (o.device == DeviceType::kCuda && o.threads != 0) {
    throw UsageError{"--threads sets the CPU engine's worker threads; leave it out with --device cuda"};
  }
  if (!o.shapes.empty() && (have_tensors || have_numel)) {
    throw UsageError{"--shapes gpt2 fixes the tensors and their sizes; leave out --tensors and --numel"};
  }
  if (o.shapes.empty() &&
      static_cast<double>(o.groups) * o.tensors * static_cast<double>(o.numel) > static_cast<double>(kMaxElements)) {
    throw UsageError{"--groups x --tensors x --numel = " +
                     std::to_string(static_cast<double>(o.groups) * o.tensors * static_cast<double>(o.numel)) +
                     " elements is beyond any device; make the model smaller"};
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// The model: element counts per tensor, per group.

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

struct Model {
  std::vector<std::vector<std::int64_t>> groups;  // numel of each tensor of each group
  std::int64_t tensors = 0;
  std::int64_t elements = 0;
};

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

// ---------------------------------------------------------------------------------------------
// Clocks.

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// CLOCK_MONOTONIC seconds of a steady_clock time point: the clock every process on the machine
// shares, so a parent process can compare it with its own (Python's time.monotonic()).
double monotonic_seconds(Clock::time_point t) {
  timespec now_ts{};
  clock_gettime(CLOCK_MONOTONIC, &now_ts);
  const Clock::time_point now = Clock::now();
  const double now_s = static_cast<double>(now_ts.tv_sec) + static_cast<double>(now_ts.tv_nsec) * 1e-9;
  return now_s - std::chrono::duration<double>(now - t).count();
}

// Milliseconds from the process's start (the kernel's record, /proc/self/stat field 22, in clock
// ticks since boot: CLOCK_BOOTTIME) to `main_start`. nullopt where it cannot be read.
std::optional<double> process_start_to_main_ms(Clock::time_point main_start) {
  std::ifstream f("/proc/self/stat");
  std::string line;
  if (!std::getline(f, line)) return std::nullopt;
  const std::size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 > line.size()) return std::nullopt;
  std::istringstream in(line.substr(close + 2));
  std::string field;
  for (int index = 3; index <= 22; ++index) {
    if (!(in >> field)) return std::nullopt;
  }
  unsigned long long start_ticks = 0;
  try {
    start_ticks = std::stoull(field);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const long hz = sysconf(_SC_CLK_TCK);
  timespec boot{};
  if (hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &boot) != 0) return std::nullopt;
  const Clock::time_point now = Clock::now();
  const double boot_now_s = static_cast<double>(boot.tv_sec) + static_cast<double>(boot.tv_nsec) * 1e-9;
  const double main_boot_s = boot_now_s - std::chrono::duration<double>(now - main_start).count();
  return (main_boot_s - static_cast<double>(start_ticks) / static_cast<double>(hz)) * 1e3;
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << v;
  return s.str();
}

std::string with_commas(std::int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<std::size_t>(i), ",");
  return s;
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()), 0);
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::string line = "  ";
    for (std::size_t c = 0; c < rows[i].size(); ++c) {
      const std::string& cell = rows[i][c];
      const std::string pad(width[c] - cell.size(), ' ');
      line += c == 0 ? cell + pad : pad + cell;  // first column left, numbers right
      if (c + 1 < rows[i].size()) line += "  ";
    }
    std::cout << line << "\n";
    if (i == 0) {
      std::size_t total = 0;
      for (std::size_t c = 0; c < width.size(); ++c) total += width[c] + (c + 1 < width.size() ? 2 : 0);
      std::cout << "  " << std::string(total, '-') << "\n";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A counting copy of the driver table: every entry forwards to the real driver and counts.

enum DriverSymbol : std::size_t {
#define LUMINAV_BENCH_SYMBOL(member, ...) k_##member,
  LUMINAV_CUDA_DRIVER_SYMBOLS(LUMINAV_BENCH_SYMBOL)
#undef LUMINAV_BENCH_SYMBOL
      kDriverSymbolCount
};

constexpr const char* kDriverSymbolNames[] = {
#define LUMINAV_BENCH_NAME(member, ...) #member,
    LUMINAV_CUDA_DRIVER_SYMBOLS(LUMINAV_BENCH_NAME)
#undef LUMINAV_BENCH_NAME
};

using CallCounts = std::array<std::uint64_t, kDriverSymbolCount>;

// Calls after which the host has waited for the device (or may have: an allocation, a free, a
// module load, a copy from or to pageable host memory). A step that makes none of these runs
// ahead of the device.
constexpr DriverSymbol kBlockingCalls[] = {
    k_cuCtxSynchronize, k_cuStreamSynchronize, k_cuEventSynchronize, k_cuMemcpyHtoD,   k_cuMemcpyDtoH,
    k_cuMemcpyHtoDAsync, k_cuMemcpyDtoHAsync, k_cuMemAlloc,          k_cuMemFree,      k_cuModuleLoadData,
    k_cuModuleUnload,   k_cuStreamCreate,     k_cuStreamDestroy,     k_cuGraphInstantiateWithFlags};

std::uint64_t blocking_calls(const CallCounts& before, const CallCounts& after) {
  std::uint64_t n = 0;
  for (DriverSymbol s : kBlockingCalls) n += after[s] - before[s];
  return n;
}

// "cuMemAlloc x4, cuCtxSynchronize x4": the blocking calls made between two snapshots.
std::string describe_blocking(const CallCounts& before, const CallCounts& after) {
  std::string out;
  for (DriverSymbol s : kBlockingCalls) {
    const std::uint64_t n = after[s] - before[s];
    if (n == 0) continue;
    if (!out.empty()) out += ", ";
    out += std::string(kDriverSymbolNames[s]) + " x" + std::to_string(n);
  }
  return out.empty() ? "none" : out;
}

// The table is used from the thread that runs the benchmark only (the engine calls the driver
// from the caller's thread), so the counters are plain integers.
struct CountingDriver {
  const CudaDriverApi* real = nullptr;
  CudaDriverApi table;
  CallCounts counts{};

  explicit CountingDriver(const CudaDriverApi& driver);
  ~CountingDriver();
  CountingDriver(const CountingDriver&) = delete;
  CountingDriver& operator=(const CountingDriver&) = delete;
};

CountingDriver* g_counting = nullptr;

template <class F>
struct Forward;
template <class... A>
struct Forward<CUresult (*)(A...)> {
  template <std::size_t I, CUresult (*CudaDriverApi::*M)(A...)>
  static CUresult call(A... a) {
    ++g_counting->counts[I];
    return (g_counting->real->*M)(a...);
  }
};

CountingDriver::CountingDriver(const CudaDriverApi& driver) : real(&driver), table(driver) {
#define LUMINAV_BENCH_FORWARD(member, ...)                                                               \
  if (driver.member != nullptr) {                                                                        \
    table.member = &Forward<decltype(CudaDriverApi::member)>::template call<k_##member, &CudaDriverApi::member>; \
  }
  LUMINAV_CUDA_DRIVER_SYMBOLS(LUMINAV_BENCH_FORWARD)
#undef LUMINAV_BENCH_FORWARD
  table.origin = driver.origin + " (calls counted by luminav bench)";
  g_counting = this;
}

CountingDriver::~CountingDriver() { g_counting = nullptr; }

// ---------------------------------------------------------------------------------------------
// Where the benchmark's params and grads live.

class Storage {
 public:
  virtual ~Storage() = default;
  // `numel` elements of `d`, filled by fill_random(key, scale); returns the engine's address.
  virtual void* make(DType d, std::int64_t numel, std::uint64_t key, float scale) = 0;
};

class HostStorage final : public Storage {
 public:
  void* make(DType d, std::int64_t numel, std::uint64_t key, float scale) override {
    blocks_.emplace_back(new unsigned char[static_cast<std::size_t>(numel) * dtype_size(d)]);
    fill_random(blocks_.back().get(), d, key, 0, numel, scale);
    return blocks_.back().get();
  }

 private:
  std::vector<std::unique_ptr<unsigned char[]>> blocks_;
};

// The device's primary context, current while the object lives; a stream, two timing events and
// device buffers in it. Everything is released in the destructor, whatever step failed.
class CudaSession final : public Storage {
 public:
  CudaSession(const CudaDriverApi& api, int ordinal) : api_(api) {
    int count = 0;
    check(api_, api_.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count == 0) {
      throw Error(Status::kNotFound, "the CUDA driver sees no device (check nvidia-smi and CUDA_VISIBLE_DEVICES); "
                                     "`luminav bench - --device cpu` measures the CPU engine");
    }
    if (ordinal >= count) {
      throw Error(Status::kNotFound, "CUDA device " + std::to_string(ordinal) + " does not exist: the driver sees " +
                                         std::to_string(count) + " device(s); pick --device-index below " +
                                         std::to_string(count) + " (and check CUDA_VISIBLE_DEVICES)");
    }
    check(api_, api_.cuDeviceGet(&device_, ordinal), "cuDeviceGet", "device " + std::to_string(ordinal));
    check(api_, api_.cuDevicePrimaryCtxRetain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
    retained_ = true;
    check(api_, api_.cuCtxPushCurrent(ctx_), "cuCtxPushCurrent");
    pushed_ = true;
    check(api_, api_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(api_, api_.cuEventCreate(&start_, CU_EVENT_DEFAULT), "cuEventCreate");
    check(api_, api_.cuEventCreate(&stop_, CU_EVENT_DEFAULT), "cuEventCreate");
  }
  ~CudaSession() override {
    if (pushed_) api_.cuCtxSynchronize();
    for (CUdeviceptr p : buffers_) api_.cuMemFree(p);
    if (start_) api_.cuEventDestroy(start_);
    if (stop_) api_.cuEventDestroy(stop_);
    if (stream_) api_.cuStreamDestroy(stream_);
    if (pushed_) {
      CUcontext popped = nullptr;
      api_.cuCtxPopCurrent(&popped);
    }
    if (retained_) api_.cuDevicePrimaryCtxRelease(device_);
  }
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;

  void* make(DType d, std::int64_t numel, std::uint64_t key, float scale) override {
    const std::size_t bytes = static_cast<std::size_t>(numel) * dtype_size(d);
    CUdeviceptr p = 0;
    check(api_, api_.cuMemAlloc(&p, bytes), "cuMemAlloc",
          "allocating " + std::to_string(bytes) + " bytes for a benchmark tensor; make the model smaller");
    buffers_.push_back(p);
    // Filled and uploaded in chunks: the host never holds more than one chunk.
    constexpr std::int64_t kChunk = std::int64_t{1} << 22;
    host_.resize(static_cast<std::size_t>(std::min(numel, kChunk)) * dtype_size(d));
    for (std::int64_t first = 0; first < numel; first += kChunk) {
      const std::int64_t count = std::min(kChunk, numel - first);
      fill_random(host_.data(), d, key, first, count, scale);
      check(api_, api_.cuMemcpyHtoD(p + static_cast<CUdeviceptr>(first) * dtype_size(d), host_.data(),
                                    static_cast<std::size_t>(count) * dtype_size(d)),
            "cuMemcpyHtoD");
    }
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  }

  CUdevice device() const { return device_; }
  CUstream stream() const { return stream_; }
  CUevent start() const { return start_; }
  CUevent stop() const { return stop_; }

 private:
  const CudaDriverApi& api_;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  bool retained_ = false, pushed_ = false;
  CUstream stream_ = nullptr;
  CUevent start_ = nullptr, stop_ = nullptr;
  std::vector<CUdeviceptr> buffers_;
  std::vector<unsigned char> host_;
};

// "NVIDIA H200": cuDeviceGetName is not in the library's driver table (the engine never needs
// it), so it is looked up here, from the library the table came from; a generic name otherwise.
std::string cuda_device_name(const CudaDriverApi& real, CUdevice device, int ordinal) {
  std::string name;
  if (real.origin == "libcuda.so.1") {
    if (void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
      using GetName = CUresult (*)(char*, int, CUdevice);
      if (auto fn = reinterpret_cast<GetName>(dlsym(handle, "cuDeviceGetName"))) {
        char buf[256] = {0};
        if (fn(buf, static_cast<int>(sizeof buf - 1), device) == CUDA_SUCCESS) name = buf;
      }
      dlclose(handle);
    }
  }
  return name.empty() ? "CUDA device " + std::to_string(ordinal) : name;
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string v = line.substr(colon + 1);
        v.erase(0, v.find_first_not_of(" \t"));
        return v;
      }
    }
  }
  return "cpu";
}

// The Triton version a bundle was built with (its manifest's "triton_version"), "" if unknown.
std::string bundle_triton_version(const std::string& dir) {
  try {
    std::ifstream f(dir + "/manifest.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.contains("triton_version") && j["triton_version"].is_string()) return j["triton_version"].get<std::string>();
  } catch (const std::exception&) {
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// CSV: one row per run, header written when the file is new.

const std::vector<std::string> kCsvColumns = {
    "date", "device", "driver", "device_index", "threads", "groups", "tensors", "total_elements", "shapes",
    "param_dtype", "grad_dtype", "state_dtype", "clip", "nonfinite", "bound", "steps", "warmup",
    "host_us_per_step", "host_us_per_group_step", "host_us_median_step", "device_us_per_step",
    "launches_per_step", "blocking_calls_per_step", "cold_start_ms", "cold_start_excl_data_ms",
    "process_start_to_main_ms", "main_start_monotonic_s", "first_step_done_monotonic_s", "bundle_triton"};

std::string csv_join(const std::vector<std::string>& cells) {
  std::string out;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    std::string c = cells[i];
    if (c.find_first_of(",\"\n") != std::string::npos) {
      std::string q = "\"";
      for (char ch : c) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      c = q + "\"";
    }
    out += (i ? "," : "") + c;
  }
  return out;
}

// Checked before anything runs, so a run never ends with results it cannot keep.
// Returns whether the header must be written.
bool check_csv(const std::string& path) {
  std::ifstream in(path);
  std::string first;
  const bool has_content = in && std::getline(in, first) && !first.empty();
  if (has_content && first != csv_join(kCsvColumns)) {
    throw Error(Status::kInvalidArgument, "--csv " + path +
                                              " holds other columns (its first line is not luminav bench's header); "
                                              "append to a new file instead");
  }
  std::ofstream out(path, std::ios::app);
  if (!out) {
    throw Error(Status::kInvalidArgument, "--csv " + path + " cannot be opened for appending: " + std::strerror(errno));
  }
  return !has_content;
}

// ---------------------------------------------------------------------------------------------
// The run.

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

Hyper make_hyper(const BenchOptions& o) {
  Hyper h;  // lr, betas, eps, weight decay: the spec's defaults
  h.clip = o.clip;
  h.nonfinite = o.nonfinite;
  h.bound_mode = o.bound;
  h.state_dtype = o.state_dtype;
  return h;
}

using ModelData = std::vector<std::vector<ParamDesc>>;  // per group, per tensor

// Params and grads of every tensor, filled, in `storage`. Tensor k's param and grad are the
// random streams 2k and 2k + 1.
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

constexpr std::uint64_t kSeed = 0x5EEDB0A7ULL;

void summarise_host(std::vector<double>& us, Results& r) {
  double total = 0;
  for (double v : us) total += v;
  r.host_us_mean = total / static_cast<double>(us.size());
  r.host_us_max = *std::max_element(us.begin(), us.end());
  std::nth_element(us.begin(), us.begin() + static_cast<std::ptrdiff_t>(us.size() / 2), us.end());
  r.host_us_median = us[us.size() / 2];
}

// Every parameter has taken 1 + warmup + steps steps (the grads are finite, nothing is skipped):
// the timings are of real steps.
void check_steps_applied(const Engine& engine, const BenchOptions& o) {
  const std::int64_t expected = 1 + static_cast<std::int64_t>(o.warmup) + o.steps;
  for (std::size_t k = 0; k < engine.num_params(); ++k) {
    const std::int64_t got = engine.param_step(k);
    if (got != expected) {
      throw Error(Status::kInternal, "parameter " + std::to_string(k) + " took " + std::to_string(got) +
                                         " steps, expected " + std::to_string(expected) +
                                         " (1 + warmup + steps): the timings do not describe full steps");
    }
  }
  const std::int64_t skipped = engine.skipped_steps();
  if (skipped != 0) {
    throw Error(Status::kInternal, "the engine skipped " + std::to_string(skipped) +
                                       " steps on finite gradients: the timings do not describe full steps");
  }
}

// Host wall time of each of `steps` calls of `step`, in microseconds; nothing waits in between.
template <class StepFn>
std::vector<double> time_host(int steps, StepFn&& step) {
  std::vector<double> us(static_cast<std::size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    const Clock::time_point t = Clock::now();
    step();
    us[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::micro>(Clock::now() - t).count();
  }
  return us;
}

Results run_cpu(const BenchOptions& o, const Model& model) {
  Results r;
  r.driver = "-";
  HostStorage storage;
  const ModelData data = make_data(storage, model, o);
  r.phases.push_back({"data: host RNG fill", Clock::now(), true});
  EngineOptions eo;
  eo.device = DeviceType::kCpu;
  eo.num_threads = o.threads;
  eo.seed = kSeed;
  Engine engine(eo);
  r.phases.push_back({"engine created (thread pool)", Clock::now()});
  add_params(engine, data, make_hyper(o));
  r.phases.push_back({"parameters added (moments allocated)", Clock::now()});
  engine.step();
  r.phases.push_back({"first step finished", Clock::now()});

  for (int i = 0; i < o.warmup; ++i) engine.step();
  std::vector<double> us = time_host(o.steps, [&] { engine.step(); });
  summarise_host(us, r);
  check_steps_applied(engine, o);
  r.threads = engine.num_threads();
  r.device_name = cpu_name() + " (" + std::to_string(r.threads) + " threads)";
  return r;
}

Results run_cuda(const BenchOptions& o, const Model& model) {
  Results r;
  const CudaDriverApi* real = nullptr;
  try {
    real = &cuda_driver();  // dlopen + cuInit, once per process
  } catch (const Error& e) {
    throw Error(e.status(), std::string(e.what()) + " (`luminav bench - --device cpu` measures the CPU engine)");
  }
  r.phases.push_back({"CUDA driver loaded (dlopen, cuInit)", Clock::now()});
  // Declared before everything that calls the driver, so it outlives all of it.
  CountingDriver counting(*real);
  ScopedDriverOverride counted(&counting.table);
  const CudaDriverApi& api = counting.table;
  CudaSession session(api, o.device_index);
  r.phases.push_back({"context, stream, events", Clock::now()});
  int major = 0, minor = 0, sms = 0;
  check(api, api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, session.device()),
        "cuDeviceGetAttribute");
  check(api, api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, session.device()),
        "cuDeviceGetAttribute");
  check(api, api.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, session.device()),
        "cuDeviceGetAttribute");
  r.device_name = cuda_device_name(*real, session.device(), o.device_index) + " (sm_" + std::to_string(major) +
                  std::to_string(minor) + ", " + std::to_string(sms) + " SMs)";
  r.driver = real->driver_version > 0 ? std::to_string(real->driver_version / 1000) + "." +
                                            std::to_string((real->driver_version % 1000) / 10)
                                      : "unknown";

  const ModelData data = make_data(session, model, o);
  r.phases.push_back({"data: host RNG fill, cuMemcpyHtoD", Clock::now(), true});
  EngineOptions eo;
  eo.device = DeviceType::kCuda;
  eo.device_index = o.device_index;
  eo.seed = kSeed;
  eo.bundle_dir = o.bundle;
  Engine engine(eo);
  r.phases.push_back({"engine created (manifest read)", Clock::now()});
  add_params(engine, data, make_hyper(o));
  r.phases.push_back({"parameters added (moments allocated)", Clock::now()});

  void* stream = session.stream();
  const CallCounts before_first = counting.counts;
  engine.step(stream);
  r.phases.push_back({"first step enqueued (cubins read, hashed, loaded; tables)", Clock::now()});
  check(api, api.cuStreamSynchronize(session.stream()), "cuStreamSynchronize", "waiting for the first step");
  r.phases.push_back({"first step finished (stream synchronised)", Clock::now()});
  const CallCounts after_first = counting.counts;
  r.first_step_calls = std::to_string(after_first[k_cuLaunchKernel] - before_first[k_cuLaunchKernel]) +
                       " launches, " +
                       std::to_string(after_first[k_cuModuleLoadData] - before_first[k_cuModuleLoadData]) +
                       " module loads; blocking calls: " + describe_blocking(before_first, after_first);

  for (int i = 0; i < o.warmup; ++i) engine.step(stream);
  check(api, api.cuStreamSynchronize(session.stream()), "cuStreamSynchronize", "after the warm-up steps");
  check(api, api.cuEventRecord(session.start(), session.stream()), "cuEventRecord");
  const CallCounts before = counting.counts;
  std::vector<double> us = time_host(o.steps, [&] { engine.step(stream); });
  const CallCounts after = counting.counts;
  check(api, api.cuEventRecord(session.stop(), session.stream()), "cuEventRecord");
  check(api, api.cuEventSynchronize(session.stop()), "cuEventSynchronize", "waiting for the timed steps");
  float ms = 0;
  check(api, api.cuEventElapsedTime(&ms, session.start(), session.stop()), "cuEventElapsedTime");
  r.device_us = static_cast<double>(ms) * 1e3 / o.steps;
  r.launches_per_step = static_cast<double>(after[k_cuLaunchKernel] - before[k_cuLaunchKernel]) / o.steps;
  r.graph_launches_per_step = static_cast<double>(after[k_cuGraphLaunch] - before[k_cuGraphLaunch]) / o.steps;
  r.blocking_per_step = static_cast<double>(blocking_calls(before, after)) / o.steps;
  r.blocking_detail = describe_blocking(before, after);
  summarise_host(us, r);
  check_steps_applied(engine, o);
  return r;
}

// ---------------------------------------------------------------------------------------------
// The report.

struct ColdStart {
  double total_ms = 0;      // main() to the first finished step
  double data_ms = 0;       // of which the benchmark's own data fill
  std::optional<double> start_to_main_ms;
};

ColdStart cold_start(const Results& r, Clock::time_point main_start) {
  ColdStart c;
  Clock::time_point previous = main_start;
  for (const Phase& p : r.phases) {
    if (p.is_data) c.data_ms += ms_between(previous, p.end);
    previous = p.end;
  }
  c.total_ms = ms_between(main_start, r.phases.back().end);
  c.start_to_main_ms = process_start_to_main_ms(main_start);
  return c;
}

void print_report(const BenchOptions& o, const Model& model, const Results& r, const ColdStart& c,
                  Clock::time_point main_start) {
  const bool cuda = o.device == DeviceType::kCuda;
  std::cout << "luminav bench: " << (cuda ? "cuda device " + std::to_string(o.device_index) + ", " : "cpu, ")
            << r.device_name << (cuda ? ", driver " + r.driver + ", bundle " + o.bundle : std::string()) << "\n";
  const double param_mib = static_cast<double>(model.elements) * static_cast<double>(dtype_size(o.dtype)) / 1048576.0;
  std::cout << "model: " << model.groups.size() << " group(s), " << model.tensors << " tensors"
            << (o.shapes.empty() ? " of " + with_commas(o.numel) : " (" + o.shapes + ")") << ", "
            << with_commas(model.elements) << " elements (" << fixed(param_mib, 1) << " MiB of params); param/grad "
            << dtype_word(o.dtype) << ", state " << dtype_word(o.state_dtype) << "; clip " << o.clip << ", nonfinite "
            << nonfinite_name(o.nonfinite) << ", bound " << bound_mode_name(o.bound) << "\n\n";

  std::cout << "cold start (steady_clock from the first statement of main()):\n";
  std::vector<std::vector<std::string>> rows = {{"phase", "ms", "since main, ms"}};
  Clock::time_point previous = main_start;
  for (const Phase& p : r.phases) {
    rows.push_back({p.name, fixed(ms_between(previous, p.end), 2), fixed(ms_between(main_start, p.end), 2)});
    previous = p.end;
  }
  print_table(rows);
  std::cout << "  cold start: " << fixed(c.total_ms, 1) << " ms to the first finished step, "
            << fixed(c.total_ms - c.data_ms, 1) << " ms without the benchmark's data fill\n";
  if (c.start_to_main_ms) {
    std::cout << "  process start to main(): " << fixed(*c.start_to_main_ms, 1)
              << " ms (/proc/self/stat starttime, resolution 1 clock tick = " << fixed(1e3 / sysconf(_SC_CLK_TCK), 0)
              << " ms)\n";
  }
  if (!r.first_step_calls.empty()) std::cout << "  first step's driver calls: " << r.first_step_calls << "\n";

  std::cout << "\nsteps: " << o.warmup << " warm-up, " << o.steps << " timed"
            << (cuda ? " (enqueued back to back; the stream is synchronised after the batch)" : " (synchronous)")
            << "\n";
  const double groups = static_cast<double>(model.groups.size());
  rows = {{"metric", "value"},
          {"host us/step (mean)", fixed(r.host_us_mean, 2)},
          {"host us/step (median)", fixed(r.host_us_median, 2)},
          {"host us/step (max)", fixed(r.host_us_max, 2)},
          {"host us/group/step (mean)", fixed(r.host_us_mean / groups, 2)}};
  if (cuda) {
    rows.push_back({"device us/step (events around the batch)", fixed(r.device_us, 2)});
    rows.push_back({"kernel launches/step", fixed(r.launches_per_step, 1)});
    rows.push_back({"graph launches/step", fixed(r.graph_launches_per_step, 1)});
    rows.push_back({"blocking driver calls/step", fixed(r.blocking_per_step, 2)});
  }
  print_table(rows);
  if (cuda) {
    if (r.blocking_per_step > 0) {
      std::cout << "  WARNING: the timed steps made blocking driver calls (" << r.blocking_detail
                << "): step() waits for the device";
      if (o.nonfinite == NonFinite::kSkip) std::cout << ", although the engine promises no host sync with nonfinite=skip";
      std::cout << "\n";
    } else {
      std::cout << "  no host sync: the timed steps made no synchronising or allocating driver call\n";
    }
    if (r.host_us_mean >= 0.9 * r.device_us) {
      std::cout << "  note: the device kept pace with the host, so device us/step is the host's pace (host-bound), or\n"
                   "        the launch queue filled and step() waited for it (then max >> median host us/step);\n"
                   "        a larger --numel measures the device, a smaller one the host overhead alone\n";
    }
  }
}

std::vector<std::string> csv_row(const BenchOptions& o, const Model& model, const Results& r, const ColdStart& c,
                                 Clock::time_point main_start) {
  const double groups = static_cast<double>(model.groups.size());
  return {today(),
          r.device_name,
          r.driver,
          o.device == DeviceType::kCuda ? std::to_string(o.device_index) : "-",
          o.device == DeviceType::kCpu ? std::to_string(r.threads) : "-",
          std::to_string(model.groups.size()),
          std::to_string(model.tensors),
          std::to_string(model.elements),
          o.shapes.empty() ? "uniform-" + std::to_string(o.numel) : o.shapes,
          dtype_word(o.dtype),
          dtype_word(o.dtype),
          dtype_word(o.state_dtype),
          fixed(o.clip, 3),
          nonfinite_name(o.nonfinite),
          bound_mode_name(o.bound),
          std::to_string(o.steps),
          std::to_string(o.warmup),
          fixed(r.host_us_mean, 3),
          fixed(r.host_us_mean / groups, 3),
          fixed(r.host_us_median, 3),
          std::isfinite(r.device_us) ? fixed(r.device_us, 3) : "",
          std::isfinite(r.launches_per_step) ? fixed(r.launches_per_step, 2) : "",
          std::isfinite(r.blocking_per_step) ? fixed(r.blocking_per_step, 3) : "",
          fixed(c.total_ms, 3),
          fixed(c.total_ms - c.data_ms, 3),
          c.start_to_main_ms ? fixed(*c.start_to_main_ms, 1) : "",
          fixed(monotonic_seconds(main_start), 6),
          fixed(monotonic_seconds(r.phases.back().end), 6),
          o.bundle.empty() ? "" : bundle_triton_version(o.bundle)};
}

}  // namespace

int run_bench(const std::vector<std::string>& args, Clock::time_point main_start) {
  try {
    for (const std::string& a : args) {
      if (a == "-h" || a == "--help") {
        std::cout << kBenchUsage;
        return 0;
      }
    }
    const BenchOptions o = parse_bench_options(args);
    const Model model = make_model(o);
    const bool csv_header = !o.csv.empty() && check_csv(o.csv);
    const Clock::time_point parsed = Clock::now();
    Results r = o.device == DeviceType::kCuda ? run_cuda(o, model) : run_cpu(o, model);
    r.phases.insert(r.phases.begin(), Phase{"arguments parsed", parsed});
    const ColdStart c = cold_start(r, main_start);
    print_report(o, model, r, c, main_start);
    if (!o.csv.empty()) {
      std::ofstream out(o.csv, std::ios::app);
      if (csv_header) out << csv_join(kCsvColumns) << "\n";
      out << csv_join(csv_row(o, model, r, c, main_start)) << "\n";
      out.flush();
      if (!out) throw Error(Status::kInvalidArgument, "--csv " + o.csv + ": the row could not be written");
      std::cout << "appended a row to " << o.csv << "\n";
    }
    return 0;
  } catch (const UsageError& e) {
    std::cerr << "luminav bench: " << e.message << " (luminav bench --help lists the options)\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "luminav bench: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "luminav bench: out of host memory; make the model smaller (--numel, --tensors, --groups)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "luminav bench: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::cerr << "luminav bench: an unknown exception ended the run\n";
    return 1;
  }
}

}  // namespace tools
}  // namespace luminav

// tools/bench/report.cpp: what `luminav bench` prints and appends: the cold start phase by phase,
// the host and device time per step, the driver calls, and one CSV row per run
#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "common/table.h"
#include "luminav/error.h"

namespace luminav {
namespace tools {
namespace bench {

namespace {

// First column left, numbers right, indented under their heading.
const TableStyle kReportTable{"  ", true};

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
  print_table(rows, kReportTable);
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
  print_table(rows, kReportTable);
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

void append_csv(const BenchOptions& o, const Model& model, const Results& r, const ColdStart& c,
                Clock::time_point main_start, bool header) {
  std::ofstream out(o.csv, std::ios::app);
  if (header) out << csv_join(kCsvColumns) << "\n";
  out << csv_join(csv_row(o, model, r, c, main_start)) << "\n";
  out.flush();
  if (!out) throw Error(Status::kInvalidArgument, "--csv " + o.csv + ": the row could not be written");
  std::cout << "appended a row to " << o.csv << "\n";
}

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

}  // namespace bench
}  // namespace tools
}  // namespace luminav

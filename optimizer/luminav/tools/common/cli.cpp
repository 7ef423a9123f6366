// tools/common/cli.cpp: the command-line helpers the luminav subcommands share (see cli_args.h)
#include <exception>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "aot/manifest.h"
#include "common/cli_args.h"
#include "luminav/cuda_driver.h"
#include "luminav/error.h"

namespace luminav {
namespace tools {

std::int64_t parse_int(const std::string& flag, const std::string& value, std::int64_t lo, std::int64_t hi) {
  try {
    std::size_t used = 0;
    const long long v = std::stoll(value, &used);
    if (used != value.size() || v < lo || v > hi) throw std::out_of_range("range");
    return v;
  } catch (const std::exception&) {
    throw UsageError{flag + " takes an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got \"" + value + "\""};
  }
}

const std::string& ArgCursor::value() {
  if (i_ + 1 >= args_.size()) throw UsageError{arg() + " needs a value"};
  return args_[++i_];
}

BundleOptions parse_bundle_options(const std::vector<std::string>& args, bool takes_steps, bool takes_require_gpu) {
  BundleOptions o;
  for (ArgCursor cursor(args); cursor.next();) {
    const std::string& a = cursor.arg();
    if (a == "--device") {
      o.device = static_cast<int>(parse_int(a, cursor.value(), 0, 1 << 16));
    } else if (a == "--steps" && takes_steps) {
      o.steps = static_cast<int>(parse_int(a, cursor.value(), 1, 1000));
    } else if (a == "--require-gpu" && takes_require_gpu) {
      o.require_gpu = true;
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError{"unknown option " + a};
    } else if (o.bundle.empty()) {
      o.bundle = a;
    } else {
      throw UsageError{"unexpected argument \"" + a + "\""};
    }
  }
  if (o.bundle.empty()) throw UsageError{"missing BUNDLE (a folder with manifest.json)"};
  return o;
}

std::string sm(int arch) { return "sm_" + std::to_string(arch); }

std::string human_bytes(std::size_t n) {
  std::ostringstream s;
  if (n >= (1u << 20)) {
    s.precision(1);
    s << std::fixed << n / 1048576.0 << " MiB";
  } else if (n >= 1024) {
    s.precision(1);
    s << std::fixed << n / 1024.0 << " KiB";
  } else {
    s << n << " B";
  }
  return s.str();
}

void print_header(const AotManifest& m) {
  std::size_t bytes = 0;
  for (const auto& k : m.kernels()) bytes += k.cubin_bytes;
  std::cout << m.dir() << ": format " << kAotBundleFormat << " v" << m.format_version() << " (" << m.table_cols()
            << "-column tables), created by "
            << (m.created_by().empty() ? "(unknown)" : m.created_by()) << ", Triton "
            << (m.triton_version().empty() ? "(unknown)" : m.triton_version()) << ", " << m.kernels().size()
            << " variants (" << m.keys().size() << " keys), " << human_bytes(bytes) << " of code objects\n";
}

EngineOptions engine_options(DeviceType device, int device_index, int threads, std::uint64_t seed,
                             const std::string& bundle) {
  EngineOptions eo;
  eo.device = device;
  eo.seed = seed;
  if (device == DeviceType::kCuda) {
    eo.device_index = device_index;
    eo.bundle_dir = bundle;
  } else {
    eo.num_threads = threads;
  }
  return eo;
}

std::string no_driver_reason() {
  try {
    cuda_driver();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tools
}  // namespace luminav

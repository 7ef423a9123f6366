// tools/bench/options.cpp: the options of `luminav bench` and their checks
#include <cmath>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "common/cli_args.h"

namespace luminav {
namespace tools {
namespace bench {

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
    "  --state-dtype fp32|bf16|q8 moments (default fp32; q8: one byte an element and a float32\n"
    "                             scale a block of 256, each tensor one row)\n"
    "  --clip C                   soft-clip threshold, 0 = off (default 4)\n"
    "  --nonfinite skip|propagate (default skip)\n"
    "  --bound none|abs|rel       (default none)\n"
    "  --steps S                  timed steps (default 100)\n"
    "  --warmup W                 untimed steps after the first one (default 10)\n"
    "  --threads N                CPU engine worker threads, 0 = one per hardware thread\n"
    "  --csv FILE                 append one row (device, driver, sizes, dtypes, times)\n";

namespace {

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

// --state-dtype: the param dtypes, and q8 (one-byte codes with a float32 scale a block of 256).
DType parse_state_dtype(const std::string& flag, const std::string& value) {
  if (value == "q8") return DType::kQ8;
  if (value == "fp32" || value == "float32" || value == "bf16" || value == "bfloat16") return parse_dtype(flag, value);
  throw UsageError{flag + " takes fp32, bf16 or q8, got \"" + value + "\""};
}

}  // namespace

BenchOptions parse_bench_options(const std::vector<std::string>& args) {
  BenchOptions o;
  bool have_bundle = false, have_device = false, have_tensors = false, have_numel = false;
  for (ArgCursor cursor(args); cursor.next();) {
    const std::string& a = cursor.arg();
    if (a == "--device") {
      const std::string v = cursor.value();
      if (v == "cuda") o.device = DeviceType::kCuda;
      else if (v == "cpu") o.device = DeviceType::kCpu;
      else throw UsageError{"--device takes cuda or cpu, got \"" + v + "\""};
      have_device = true;
    } else if (a == "--device-index") {
      o.device_index = static_cast<int>(parse_int(a, cursor.value(), 0, 65535));
    } else if (a == "--groups") {
      o.groups = static_cast<int>(parse_int(a, cursor.value(), 1, 65536));
    } else if (a == "--tensors") {
      o.tensors = static_cast<int>(parse_int(a, cursor.value(), 1, 1 << 20));
      have_tensors = true;
    } else if (a == "--numel") {
      o.numel = parse_int(a, cursor.value(), 1, kMaxElements);
      have_numel = true;
    } else if (a == "--shapes") {
      o.shapes = cursor.value();
      if (o.shapes != "gpt2") throw UsageError{"--shapes takes gpt2, got \"" + o.shapes + "\""};
    } else if (a == "--dtype") {
      o.dtype = parse_dtype(a, cursor.value());
    } else if (a == "--state-dtype") {
      o.state_dtype = parse_state_dtype(a, cursor.value());
    } else if (a == "--clip") {
      o.clip = parse_clip(a, cursor.value());
    } else if (a == "--nonfinite") {
      const std::string v = cursor.value();
      if (v == "skip") o.nonfinite = NonFinite::kSkip;
      else if (v == "propagate") o.nonfinite = NonFinite::kPropagate;
      else throw UsageError{"--nonfinite takes skip or propagate, got \"" + v + "\" ('raise' syncs with the host every step)"};
    } else if (a == "--bound") {
      const std::string v = cursor.value();
      if (v == "none") o.bound = BoundMode::kNone;
      else if (v == "abs") o.bound = BoundMode::kAbs;
      else if (v == "rel") o.bound = BoundMode::kRel;
      else throw UsageError{"--bound takes none, abs or rel, got \"" + v + "\""};
    } else if (a == "--steps") {
      o.steps = static_cast<int>(parse_int(a, cursor.value(), 1, 10000000));
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(parse_int(a, cursor.value(), 0, 10000000));
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_int(a, cursor.value(), 0, 4096));
    } else if (a == "--csv") {
      o.csv = cursor.value();
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

}  // namespace bench
}  // namespace tools
}  // namespace luminav

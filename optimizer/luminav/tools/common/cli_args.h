// tools/common/cli_args.h: what the luminav subcommands share on the command line: usage errors,
// integer options, the options of the subcommands that take a BUNDLE, and the entry points main
// dispatches to outside luminav.cpp
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace luminav {

class AotManifest;

namespace tools {

// A command-line mistake: printed with the usage, exit code 2.
struct UsageError {
  std::string message;
};

// `value` of `flag` as an integer in [lo, hi]; anything else is a UsageError naming both.
std::int64_t parse_int(const std::string& flag, const std::string& value, std::int64_t lo, std::int64_t hi);

// A subcommand's arguments, one at a time:
//   for (ArgCursor a(args); a.next();) { if (a.arg() == "--device") device = a.value(); ... }
class ArgCursor {
 public:
  explicit ArgCursor(const std::vector<std::string>& args) : args_(args) {}
  // Moves to the next argument; false after the last.
  bool next() { return ++i_ < args_.size(); }
  const std::string& arg() const { return args_[i_]; }
  // The argument after the current one (the current flag's value), which it consumes; a
  // UsageError "<flag> needs a value" when there is none.
  const std::string& value();

 private:
  const std::vector<std::string>& args_;
  std::size_t i_ = static_cast<std::size_t>(-1);
};

// The options of inspect, verify and selftest: BUNDLE [--device N] [--steps S] [--require-gpu].
struct BundleOptions {
  std::string bundle;
  int device = 0;
  int steps = 3;
  bool require_gpu = false;
};
// Throws UsageError for an option the subcommand does not take (--steps without `takes_steps`,
// --require-gpu without `takes_require_gpu`), a second BUNDLE or none.
BundleOptions parse_bundle_options(const std::vector<std::string>& args, bool takes_steps, bool takes_require_gpu);

// "sm_90"
std::string sm(int arch);
// "512 B", "3.2 KiB", "1.5 MiB"
std::string human_bytes(std::size_t n);
// The bundle's one-line summary (folder, format, table layout, creator, Triton, variants, size).
void print_header(const AotManifest& m);
// Why cuda_driver() fails (its error message); "" when a driver loads.
std::string no_driver_reason();

// The engine options of a tool's run: the CPU engine with `threads` workers (`device_index` and
// `bundle` unused), or CUDA device `device_index` running `bundle`'s kernels.
EngineOptions engine_options(DeviceType device, int device_index, int threads, std::uint64_t seed,
                             const std::string& bundle);

// `luminav selftest`: the CUDA engine (the bundle's kernels) against the CPU engine (selftest.cpp).
int run_selftest(const BundleOptions& o);

// `luminav bench`: cold start and host time per step (bench/). `main_start` is steady_clock::now()
// taken as the first statement of main(): the cold start is measured from it. Prints a report on
// stdout, errors on stderr. Returns 0 (done), 1 (a failure: no driver, a bad bundle, a CSV that
// cannot be written...) or 2 (bad usage). Never throws.
int run_bench(const std::vector<std::string>& args, std::chrono::steady_clock::time_point main_start);

}  // namespace tools
}  // namespace luminav

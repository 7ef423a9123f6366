// `luminav bench`: cold start and host time per step of the engine (bench.cpp).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace luminav {
namespace tools {

// The option list `luminav bench --help` prints.
extern const char* const kBenchUsage;

// Runs `luminav bench <args>`. `main_start` is steady_clock::now() taken as the first statement
// of main(): the cold start is measured from it. Prints a report on stdout, errors on stderr.
// Returns 0 (done), 1 (a failure: no driver, a bad bundle, a CSV that cannot be written...) or
// 2 (bad usage). Never throws.
int run_bench(const std::vector<std::string>& args, std::chrono::steady_clock::time_point main_start);

}  // namespace tools
}  // namespace luminav

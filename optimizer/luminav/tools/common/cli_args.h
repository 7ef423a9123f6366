// Argument parsing shared by the `luminav` subcommands.
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace luminav {
namespace tools {

// A command-line mistake: printed with the usage, exit code 2.
struct UsageError {
  std::string message;
};

// `value` of `flag` as an integer in [lo, hi]; anything else is a UsageError naming both.
inline std::int64_t parse_int(const std::string& flag, const std::string& value, std::int64_t lo,
                              std::int64_t hi) {
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

}  // namespace tools
}  // namespace luminav

// src/aot/bundle_rules.h: the bundle rule book's reason codes, the limits every reader applies,
// and BundleError, the refusal of a bundle with its code, file, field, expected and found
//
// docs/bundle-format.md ("The rule book") lists each rule with its code; the Python tooling has
// the same table (python/luminamoon/aot/rules.py), compared with this one through
// luminamoon._luminav.BUNDLE_RULES by tests/test_bundle_rules.py. A code is stable: tools and
// tests match on it, never on the message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "luminav/error.h"

namespace luminav {

// In the rule book's order. Never renumbered (the codes are the stable names; the values are
// only this build's).
enum class BundleRule : int {
  // files
  kMissingFile,
  kNotRegularFile,
  kTooLarge,
  kUnreadable,
  // the manifest
  kBadJson,
  kBadType,
  kFormat,
  kFormatVersion,
  kMissingField,
  kBadValue,
  kHipTarget,
  kNumParams,
  kScratch,
  kKeyMismatch,
  kDuplicate,
  // the code objects (cubins, hsaco files)
  kTruncated,
  kElfHeader,
  kElfSection,
  kHsacoNote,
  kSha256,
  kNoEntrySymbol,
  kArch,
  kWavefrontSize,
  kParamMismatch,
  kLaunchShape,
  // at load on a device (the runtime): a cubin the device cannot run, more threads or shared
  // memory than it allows, thread block clusters, or a parameter list the driver reports
  // differently. Not a rule of the bundle alone, so not in the Python table.
  kDevice,
};
constexpr int kBundleRuleCount = static_cast<int>(BundleRule::kDevice) + 1;

struct BundleRuleInfo {
  BundleRule rule;
  const char* code;         // e.g. "sha256"
  const char* description;  // one line, as docs/bundle-format.md words it
};
// Every rule, in order (kBundleRuleCount entries).
const BundleRuleInfo* bundle_rules();
const char* bundle_rule_code(BundleRule rule);

constexpr std::uint64_t kManifestMaxBytes = std::uint64_t{16} << 20;
constexpr std::uint64_t kCubinMaxBytes = std::uint64_t{64} << 20;
constexpr int kJsonMaxDepth = 16;  // the manifest's own depth is 4
constexpr std::size_t kNameMaxBytes = 255;

// A refused bundle: Error(kBundleError) whose message is "<where>: <what>; <fix> [<code>]", with
// the parts kept for tools and bindings. `file` is the file at fault (manifest or cubin), `field`
// the dotted field as Python's BundleError names it ("kernels[3].sha256", "(file)",
// "(top level)").
class BundleError : public Error {
 public:
  BundleError(BundleRule rule, std::string file, std::string field, std::string expected, std::string found,
              const std::string& message);
  BundleRule rule() const noexcept { return rule_; }
  const char* code() const noexcept { return bundle_rule_code(rule_); }
  const std::string& file() const noexcept { return file_; }
  const std::string& field() const noexcept { return field_; }
  const std::string& expected() const noexcept { return expected_; }
  const std::string& found() const noexcept { return found_; }

 private:
  BundleRule rule_;
  std::string file_, field_, expected_, found_;
};

// `text` made safe to print and to hand to Python: valid UTF-8 (an invalid byte becomes \xNN),
// control characters escaped, cut to `max_bytes` (with "...").
std::string printable(std::string_view text, std::size_t max_bytes = 200);

}  // namespace luminav

// src/aot/bundle_rules.cpp: the rule book's codes (the same table as
// python/luminamoon/aot/rules.py), BundleError and printable()
#include "aot/bundle_rules.h"

#include <cstdio>
#include <utility>

namespace luminav {

namespace {

const BundleRuleInfo kRules[kBundleRuleCount] = {
    {BundleRule::kMissingFile, "missing_file", "manifest.json or a cubin the manifest names does not exist"},
    {BundleRule::kNotRegularFile, "not_regular_file",
     "a FIFO, socket, device or directory, or a symbolic link that leaves the bundle folder"},
    {BundleRule::kTooLarge, "too_large", "manifest.json over 16 MiB or a cubin (hsaco) over 64 MiB"},
    {BundleRule::kUnreadable, "unreadable", "the file exists but cannot be opened or read"},
    {BundleRule::kBadJson, "bad_json",
     "not UTF-8 JSON of the manifest profile: a byte-order mark, invalid UTF-8, a lone surrogate, a duplicate "
     "object key, nesting deeper than 16, a number that is not an integer in the int64 range"},
    {BundleRule::kBadType, "bad_type",
     "the top level is not an object, or a field has the wrong JSON type (a boolean is not an integer)"},
    {BundleRule::kFormat, "format", "format missing or not \"luminamoon-aot-bundle\""},
    {BundleRule::kFormatVersion, "format_version", "format_version missing, below 1, or newer than the reader knows"},
    {BundleRule::kMissingField, "missing_field", "a required field is missing"},
    {BundleRule::kBadValue, "bad_value", "a field's value is outside its range or form"},
    {BundleRule::kHipTarget, "hip_target",
     "a HIP entry's target: backend \"hip\" below format_version 3, an arch not one of gfx90a, gfx942, gfx950, or "
     "a warp_size other than 64"},
    {BundleRule::kNumParams, "num_params",
     "num_params != len(signature) + num_trailing_scratch_ptrs, or arg_names and signature of different lengths"},
    {BundleRule::kScratch, "scratch",
     "a scratch size without its trailing pointer, or a trailing pointer count other than the one the entry's "
     "Triton version appends"},
    {BundleRule::kKeyMismatch, "key_mismatch",
     "key is not the one derived from kernel, constexprs and num_warps, or cubin is not <key>.sm<arch>.cubin (hsaco "
     "not <key>.<arch>.hsaco)"},
    {BundleRule::kDuplicate, "duplicate", "the same (key, arch) twice"},
    {BundleRule::kTruncated, "truncated",
     "a cubin empty or cut short: its header, header tables, a section or a segment reach past the end of the "
     "file"},
    {BundleRule::kElfHeader, "elf_header", "a cubin whose ELF header is not that of a CUDA ELF64 executable"},
    {BundleRule::kElfSection, "elf_section",
     "a cubin whose section table, string tables, symbols, relocations or .nv.info records are malformed or out "
     "of bounds"},
    {BundleRule::kHsacoNote, "hsaco_note",
     "an hsaco without exactly one NT_AMDGPU_METADATA note, or one whose msgpack is not the metadata map"},
    {BundleRule::kSha256, "sha256", "a cubin whose SHA-256 differs from the manifest's"},
    {BundleRule::kNoEntrySymbol, "no_entry_symbol", "the manifest's entry is not a global function symbol of the cubin"},
    {BundleRule::kArch, "arch", "the cubin's own SM arch (ELF e_flags) differs from target.arch"},
    {BundleRule::kWavefrontSize, "wavefront_size", "the hsaco kernel's .wavefront_size differs from target.warp_size"},
    {BundleRule::kParamMismatch, "param_mismatch",
     "the kernel's parameters in .nv.info differ from the signature plus the trailing scratch pointers (count, "
     "sizes or layout)"},
    {BundleRule::kLaunchShape, "launch_shape",
     "the kernel's required block size (.nv.info) differs from num_warps * warp_size"},
    {BundleRule::kDevice, "device",
     "at load on a device: a cubin the device cannot run, more threads or shared memory than it allows, thread "
     "block clusters, or a parameter list the driver reports differently"},
};

}  // namespace

const BundleRuleInfo* bundle_rules() { return kRules; }

const char* bundle_rule_code(BundleRule rule) {
  const int i = static_cast<int>(rule);
  return i >= 0 && i < kBundleRuleCount ? kRules[i].code : "unknown";
}

BundleError::BundleError(BundleRule rule, std::string file, std::string field, std::string expected,
                         std::string found, const std::string& message)
    : Error(Status::kBundleError, message + " [" + bundle_rule_code(rule) + "]"),
      rule_(rule),
      file_(std::move(file)),
      field_(std::move(field)),
      expected_(std::move(expected)),
      found_(std::move(found)) {}

std::string printable(std::string_view text, std::size_t max_bytes) {
  std::string out;
  out.reserve(text.size() < max_bytes ? text.size() : max_bytes);
  auto escape = [&out](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out += buf;
  };
  std::size_t i = 0;
  while (i < text.size()) {
    if (out.size() >= max_bytes) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      escape(c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF)
    // is kept; anything else is escaped byte by byte.
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    }
    bool ok = len > 0 && i + len <= text.size();
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto d = static_cast<unsigned char>(text[i + k]);
      ok = k == 1 ? (d >= lo && d <= hi) : (d >= 0x80 && d <= 0xbf);
    }
    if (!ok) {
      escape(c);
      ++i;
      continue;
    }
    out.append(text.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace luminav

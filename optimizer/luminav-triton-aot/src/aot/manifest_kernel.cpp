// src/aot/manifest_kernel.cpp: reads and checks one entry of a manifest's kernels array (rules
// K0-K2 of docs/bundle-format.md, in their order, the same as python/luminamoon/aot/manifest.py)
// and derives the variant key it must carry
#include <algorithm>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "aot/bundle_rules.h"
#include "aot/hsaco.h"
#include "aot/manifest.h"
#include "aot/manifest_internal.h"

namespace luminav {

using namespace manifest_detail;

namespace {

const char* const kKernelKinds[] = {"pass1", "reduce", "pass2", "single_pass", "commit"};
// The manifest's type words (docs/bundle-format.md), and pointers to them.
const char* const kTypeWords[] = {"i1", "i32", "i64", "u32", "u64", "fp16", "bf16", "fp32", "fp64"};
// The variant key's letters (docs/internals.md "Variant keys"; kernels.catalog.Variant.key()).
const std::pair<const char*, const char*> kKeyDtypeLetters[] = {{"P_DTYPE", "p"}, {"G_DTYPE", "g"}, {"S_DTYPE", "s"}};
const std::pair<const char*, const char*> kKeyLetters[] = {{"SR", "sr"},       {"BOUND_MODE", "b"}, {"USE_CLIP", "c"},
                                                           {"CHECK_FLAG", "f"}, {"NEED_SUM", "n"},   {"BLOCK", "B"},
                                                           {"RBLOCK", "R"},     {"TBLOCK", "T"}};
constexpr std::int64_t kMaxScratchBytes = std::int64_t{1} << 40;
constexpr std::int64_t kMaxScratchAlign = std::int64_t{1} << 20;
constexpr std::int64_t kMaxSharedMem = std::numeric_limits<std::int32_t>::max();

bool is_lower_hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// [A-Za-z_$][A-Za-z0-9_$]*, at most kNameMaxBytes
bool is_identifier(const std::string& s) {
  if (s.empty() || s.size() > kNameMaxBytes || !(is_alpha(s[0]) || s[0] == '_' || s[0] == '$')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return is_alpha(c) || is_digit(c) || c == '_' || c == '$'; });
}

// [A-Za-z0-9_][A-Za-z0-9._-]*, at most kNameMaxBytes: a file name inside the bundle folder
bool is_file_name(const std::string& s) {
  if (s.empty() || s.size() > kNameMaxBytes || !(is_alpha(s[0]) || is_digit(s[0]) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return is_alpha(c) || is_digit(c) || c == '.' || c == '_' || c == '-'; });
}

// Trailing scratch pointers Triton <version> appends (docs/triton-abi.md), -1 when the table
// does not know the version (outside 3.x).
int expected_trailing(const std::string& version) {
  int major = 0, minor = 0;
  if (!is_version(version, &major, &minor) || major != 3) return -1;
  return minor <= 2 ? 0 : minor <= 4 ? 1 : 2;
}

bool is_type_word(const std::string& w) {
  std::string base = w;
  if (base.rfind("*k", 0) == 0) {
    base = base.substr(2);
  } else if (base.rfind("*", 0) == 0) {
    base = base.substr(1);
  }
  return std::find(std::begin(kTypeWords), std::end(kTypeWords), base) != std::end(kTypeWords);
}

bool is_key_constexpr(const std::string& name) {
  for (const auto& l : kKeyDtypeLetters) {
    if (name == l.first) return true;
  }
  for (const auto& l : kKeyLetters) {
    if (name == l.first) return true;
  }
  return false;
}

std::string key_constexpr_list() {
  std::string out;
  for (const auto& l : kKeyDtypeLetters) out += std::string(out.empty() ? "" : ", ") + l.first;
  for (const auto& l : kKeyLetters) out += std::string(", ") + l.first;
  return out;
}

}  // namespace

namespace manifest_detail {

// <1-4 digits>.<1-4 digits>, then optionally [.+-] and [0-9A-Za-z.+_-]*; at most 64 bytes.
// Sets major/minor.
bool is_version(const std::string& s, int* major, int* minor) {
  if (s.size() > 64) return false;
  std::size_t i = 0;
  auto digits = [&](int* out) {
    const std::size_t start = i;
    int v = 0;
    while (i < s.size() && is_digit(s[i]) && i - start < 5) v = v * 10 + (s[i++] - '0');
    if (out) *out = v;
    return i > start && i - start <= 4;
  };
  if (!digits(major) || i >= s.size() || s[i] != '.') return false;
  ++i;
  if (!digits(minor)) return false;
  if (i == s.size()) return true;
  if (s[i] != '.' && s[i] != '+' && s[i] != '-') return false;
  return std::all_of(s.begin() + static_cast<long>(i) + 1, s.end(), [](char c) {
    return is_alpha(c) || is_digit(c) || c == '.' || c == '+' || c == '_' || c == '-';
  });
}

KernelMetadata parse_kernel(const json& k, std::size_t index, const std::string& manifest_path,
                            int format_version) {
  const std::string prefix = "kernels[" + std::to_string(index) + "]";
  std::string place = prefix;
  // K0
  if (!k.is_object()) {
    Where(manifest_path, "", "").fail(BundleRule::kBadType, prefix, "an object", describe(k));
  }
  // Name the variant in every later message when its key is readable.
  auto key_it = k.find("key");
  if (key_it != k.end() && key_it->is_string()) place += " (key " + show_string(key_it->get<std::string>()) + ")";
  const Where w(manifest_path, place, prefix + ".");

  // K1: every field present with its type, in order
  KernelMetadata m;
  m.index = index;
  m.key = w.string(k, "key");
  m.kernel = w.string(k, "kernel");
  m.name = w.string(k, "name");
  m.entry = w.string(k, "entry");
  // A HIP entry (format_version 3) names its code object in "hsaco", a CUDA one in "cubin".
  auto target_it = k.find("target");
  const bool hip = target_it != k.end() && target_it->is_object() && target_it->contains("backend") &&
                   (*target_it)["backend"] == "hip";
  m.cubin = w.string(k, hip ? "hsaco" : "cubin");
  m.sha256 = w.string(k, "sha256");
  const json& target = w.need(k, "target", "an object");
  if (!target.is_object()) w.fail(BundleRule::kBadType, "target", "an object", describe(target));
  const Where wt(manifest_path, place + ": target", prefix + ".target.");
  m.backend = wt.string(target, "backend");
  const std::int64_t arch = hip ? 0 : wt.integer(target, "arch");
  if (hip) m.gfx = wt.string(target, "arch");
  const std::int64_t warp_size = wt.integer(target, "warp_size");
  m.triton_version = w.string(k, "triton_version");
  const std::int64_t num_warps = w.integer(k, "num_warps");
  const std::int64_t num_ctas = w.integer(k, "num_ctas");
  const std::int64_t num_stages = w.integer(k, "num_stages");
  m.shared_mem = w.integer(k, "shared_mem");
  for (const char* list : {"arg_names", "signature"}) {
    const json& v = w.need(k, list, "an array of strings");
    if (!v.is_array()) w.fail(BundleRule::kBadType, list, "an array of strings", describe(v));
    std::vector<std::string>& out = std::strcmp(list, "arg_names") == 0 ? m.arg_names : m.signature;
    for (std::size_t j = 0; j < v.size(); ++j) {
      if (!v[j].is_string()) {
        w.fail(BundleRule::kBadType, std::string(list) + "[" + std::to_string(j) + "]", "a string", describe(v[j]));
      }
      out.push_back(v[j].get<std::string>());
    }
  }
  const json& cx = w.need(k, "constexprs", "an object of integers");
  if (!cx.is_object()) w.fail(BundleRule::kBadType, "constexprs", "an object of integers", describe(cx));
  for (auto it = cx.begin(); it != cx.end(); ++it) {  // sorted by name, as Python sorts them
    if (!it.value().is_number_integer()) {
      w.fail(BundleRule::kBadType, "constexprs." + it.key(), "an integer", describe(it.value()));
    }
    m.constexprs[it.key()] = it.value().get<std::int64_t>();
  }
  const std::int64_t num_params = w.integer(k, "num_params");
  const std::int64_t trailing = w.integer(k, "num_trailing_scratch_ptrs");
  m.global_scratch_size = w.integer(k, "global_scratch_size");
  m.global_scratch_align = w.integer(k, "global_scratch_align");
  m.profile_scratch_size = w.integer(k, "profile_scratch_size");
  m.profile_scratch_align = w.integer(k, "profile_scratch_align");

  // K2: values, in order
  if (std::find(std::begin(kKernelKinds), std::end(kKernelKinds), m.kernel) == std::end(kKernelKinds)) {
    w.fail(BundleRule::kBadValue, "kernel", "one of pass1, reduce, pass2, single_pass, commit", show_string(m.kernel));
  }
  if (m.name.empty()) w.fail(BundleRule::kBadValue, "name", "a non-empty string", "an empty string");
  if (!is_identifier(m.entry)) {
    w.fail(BundleRule::kBadValue, "entry", "a symbol name ([A-Za-z_$][A-Za-z0-9_$]*, at most 255 bytes)",
           show_string(m.entry));
  }
  if (!is_lower_hex64(m.sha256)) w.fail(BundleRule::kBadValue, "sha256", "64 lowercase hex digits", show_string(m.sha256));
  if (!is_file_name(m.cubin)) {
    w.fail(BundleRule::kBadValue, m.file_field(),
           "a file name inside the bundle folder (no path separators, no directories; letters, digits, '.', '_', "
           "'-'; at most 255 bytes)",
           show_string(m.cubin));
  }
  if (m.backend != "cuda" && !hip) {
    w.fail(BundleRule::kBadValue, "target.backend", "\"cuda\" or \"hip\"", show_string(m.backend));
  }
  if (hip) {
    if (format_version < 3) {
      w.fail(BundleRule::kHipTarget, "target.backend", "\"cuda\" (HIP entries need format_version 3 or later)",
             "\"hip\" in a format_version " + std::to_string(format_version) + " manifest", kFixRebuild);
    }
    m.arch = static_cast<int>(hsaco::arch_mach(m.gfx));
    if (m.arch == 0) {
      w.fail(BundleRule::kHipTarget, "target.arch", std::string("one of ") + hsaco::known_archs(), show_string(m.gfx));
    }
    if (warp_size != 64) w.fail(BundleRule::kHipTarget, "target.warp_size", "64", std::to_string(warp_size));
  } else {
    w.range("target.arch", arch, 10, 999);
    m.arch = static_cast<int>(arch);
    if (warp_size != 32) w.fail(BundleRule::kBadValue, "target.warp_size", "32", std::to_string(warp_size));
  }
  m.warp_size = hip ? 64 : 32;
  if (!is_version(m.triton_version)) {
    w.fail(BundleRule::kBadValue, "triton_version", "a version such as \"3.6.0\"", show_string(m.triton_version));
  }
  w.range("num_warps", num_warps, 1, 32, true);
  m.num_warps = static_cast<int>(num_warps);
  w.range("num_ctas", num_ctas, 1, 16);
  m.num_ctas = static_cast<int>(num_ctas);
  w.range("num_stages", num_stages, 0, 64);
  m.num_stages = static_cast<int>(num_stages);
  w.range("shared_mem", m.shared_mem, 0, kMaxSharedMem);
  for (std::size_t j = 0; j < m.signature.size(); ++j) {
    if (!is_type_word(m.signature[j])) {
      w.fail(BundleRule::kBadValue, "signature[" + std::to_string(j) + "]",
             "a Triton type word (i1, i32, i64, u32, u64, fp16, bf16, fp32, fp64, or a pointer *<word> or *k<word>)",
             show_string(m.signature[j]));
    }
    m.arg_types.push_back(ArgType::parse(m.signature[j]));
  }
  if (m.arg_names.size() != m.signature.size()) {
    w.fail(BundleRule::kNumParams, "arg_names",
           "one name per signature entry (" + std::to_string(m.signature.size()) + ")",
           std::to_string(m.arg_names.size()) + " names");
  }
  for (const auto& c : m.constexprs) {
    if (!is_key_constexpr(c.first)) {
      w.fail(BundleRule::kBadValue, "constexprs." + c.first,
             "a constexpr the variant key encodes (" + key_constexpr_list() + ")", show_string(c.first));
    }
  }
  w.range("num_trailing_scratch_ptrs", trailing, 0, 2);
  m.num_trailing_scratch_ptrs = static_cast<int>(trailing);
  const std::int64_t expected_params = static_cast<std::int64_t>(m.signature.size()) + trailing;
  if (num_params != expected_params) {
    w.fail(BundleRule::kNumParams, "num_params",
           std::to_string(expected_params) + " (len(signature) " + std::to_string(m.signature.size()) +
               " + num_trailing_scratch_ptrs " + std::to_string(trailing) + ")",
           std::to_string(num_params), "the manifest disagrees with itself; rebuild the bundle");
  }
  m.num_params = static_cast<int>(num_params);
  w.range("global_scratch_size", m.global_scratch_size, 0, kMaxScratchBytes);
  w.range("global_scratch_align", m.global_scratch_align, 1, kMaxScratchAlign, true);
  w.range("profile_scratch_size", m.profile_scratch_size, 0, kMaxScratchBytes);
  w.range("profile_scratch_align", m.profile_scratch_align, 1, kMaxScratchAlign, true);
  if (m.global_scratch_size > 0 && trailing < 1) {
    w.fail(BundleRule::kScratch, "global_scratch_size",
           "0 (num_trailing_scratch_ptrs is 0: the kernel has no global scratch parameter)",
           std::to_string(m.global_scratch_size));
  }
  if (m.profile_scratch_size > 0 && trailing < 2) {
    w.fail(BundleRule::kScratch, "profile_scratch_size",
           "0 (num_trailing_scratch_ptrs is " + std::to_string(trailing) +
               ": the kernel has no profile scratch parameter)",
           std::to_string(m.profile_scratch_size));
  }
  const int want_trailing = expected_trailing(m.triton_version);
  if (want_trailing >= 0 && want_trailing != trailing) {
    w.fail(BundleRule::kScratch, "num_trailing_scratch_ptrs",
           std::to_string(want_trailing) + " (what Triton " + printable(m.triton_version) + " appends)",
           std::to_string(trailing), kFixRebuild);
  }
  const std::string derived = derive_variant_key(m.kernel, m.constexprs, m.num_warps);
  if (m.key != derived) {
    w.fail(BundleRule::kKeyMismatch, "key", show_string(derived) + " (derived from kernel, constexprs and num_warps)",
           show_string(m.key), "the key does not name this variant; rebuild the bundle");
  }
  const std::string want_cubin = hip ? m.key + "." + m.gfx + ".hsaco" : m.key + ".sm" + std::to_string(m.arch) + ".cubin";
  if (m.cubin != want_cubin) {
    w.fail(BundleRule::kKeyMismatch, m.file_field(), show_string(want_cubin), show_string(m.cubin),
           std::string("the ") + (hip ? "code object" : "cubin") + " file is not this variant's; rebuild the bundle");
  }
  return m;
}

}  // namespace manifest_detail

std::string derive_variant_key(const std::string& kernel, const std::map<std::string, std::int64_t>& constexprs,
                               int num_warps) {
  std::string key = kernel;
  std::string dtypes;
  for (const auto& l : kKeyDtypeLetters) {
    auto it = constexprs.find(l.first);
    if (it != constexprs.end()) dtypes += l.second + std::to_string(it->second);
  }
  if (!dtypes.empty()) key += "." + dtypes;
  for (const auto& l : kKeyLetters) {
    auto it = constexprs.find(l.first);
    if (it != constexprs.end()) key += std::string(".") + l.second + std::to_string(it->second);
  }
  return key + ".w" + std::to_string(num_warps);
}

}  // namespace luminav

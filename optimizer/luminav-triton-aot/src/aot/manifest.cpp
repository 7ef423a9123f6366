// src/aot/manifest.cpp: reads and checks a bundle's manifest (format "luminamoon-aot-bundle",
// format_version 1 and 2) and its cubins by the rule book of docs/bundle-format.md, in its order
// and with its reason codes (the same as python/luminamoon/aot/manifest.py), and finds a variant
// by (key, device arch)
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "aot/bundle_file.h"
#include "aot/bundle_rules.h"
#include "aot/elf.h"
#include "aot/manifest.h"
#include "aot/manifest_json.h"
#include "luminav/error.h"

namespace luminav {

struct KernelMetadata::Cubin {
  std::string manifest_path, place, prefix;  // where the entry sits, for messages
  std::string dir;
  std::mutex mutex;                  // held while the file is read and checked
  std::atomic<bool> verified{false};
  std::vector<unsigned char> bytes;  // written once, under `mutex`, before `verified`
};

namespace {

using json = nlohmann::json;

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
constexpr const char* kFixRebuild = "rebuild the bundle (luminamoon aot build)";

// A JSON value described for messages: its type and, when short, its text.
std::string describe(const json& v) {
  std::string type;
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: type = "boolean"; break;
    case json::value_t::string: type = "string"; break;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: type = "integer"; break;
    case json::value_t::number_float: type = "number"; break;
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array of " + std::to_string(v.size());
    default: return "a " + std::string(v.type_name());
  }
  return type + " " + printable(v.dump(-1, ' ', false, json::error_handler_t::replace), 80);
}

std::string show_string(const std::string& s) { return "\"" + printable(s, 120) + "\""; }

// Where in the manifest a value sits: `place` for messages ("kernels[3] (key \"...\")"), `prefix`
// for the structured field ("kernels[3].").
class Where {
 public:
  Where(std::string file, std::string place, std::string prefix)
      : file_(std::move(file)), place_(std::move(place)), prefix_(std::move(prefix)) {}
  [[noreturn]] void fail(BundleRule rule, const std::string& field, const std::string& expected,
                         const std::string& found, const std::string& fix = "") const {
    std::string msg = printable(file_, 4096) + ": ";
    if (!place_.empty()) msg += place_ + ": ";
    msg += "field \"" + field + "\": expected " + expected + ", found " + found;
    if (!fix.empty()) msg += "; " + fix;
    throw BundleError(rule, file_, prefix_ + field, expected, found, msg);
  }
  const json& need(const json& obj, const std::string& name, const std::string& want) const {
    auto it = obj.find(name);
    if (it == obj.end()) fail(BundleRule::kMissingField, name, want + " (required)", "nothing (the field is missing)", kFixRebuild);
    return *it;
  }
  std::string string(const json& obj, const std::string& name) const {
    const json& v = need(obj, name, "a string");
    if (!v.is_string()) fail(BundleRule::kBadType, name, "a string", describe(v));
    return v.get<std::string>();
  }
  std::int64_t integer(const json& obj, const std::string& name) const {
    const json& v = need(obj, name, "an integer");
    if (!v.is_number_integer()) fail(BundleRule::kBadType, name, "an integer", describe(v));
    return v.get<std::int64_t>();
  }
  void range(const std::string& name, std::int64_t v, std::int64_t lo, std::int64_t hi, bool pow2 = false) const {
    if (v < lo || v > hi || (pow2 && (v & (v - 1)) != 0)) {
      fail(BundleRule::kBadValue, name,
           std::string(pow2 ? "a power of two" : "an integer") + " in " + std::to_string(lo) + ".." + std::to_string(hi),
           std::to_string(v));
    }
  }
  const std::string& file() const { return file_; }
  const std::string& place() const { return place_; }

 private:
  std::string file_, place_, prefix_;
};

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

// <1-4 digits>.<1-4 digits>, then optionally [.+-] and [0-9A-Za-z.+_-]*; at most 64 bytes.
// Sets major/minor.
bool is_version(const std::string& s, int* major = nullptr, int* minor = nullptr) {
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

// (offset, size) of each kernel parameter as the CUDA ABI lays them out: the signature's, then
// one 8-byte pointer per trailing scratch parameter, each aligned to its size.
std::vector<std::pair<std::uint32_t, std::uint32_t>> param_layout(const KernelMetadata& m) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> out;
  std::uint64_t off = 0;
  auto add = [&](std::uint64_t s) {
    off = (off + s - 1) / s * s;
    out.emplace_back(static_cast<std::uint32_t>(off), static_cast<std::uint32_t>(s));
    off += s;
  };
  for (const ArgType& t : m.arg_types) add(t.size);
  for (int i = 0; i < m.num_trailing_scratch_ptrs; ++i) add(8);
  return out;
}

std::string layout_text(const std::vector<std::pair<std::uint32_t, std::uint32_t>>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    out += (i ? ", (" : "(") + std::to_string(v[i].first) + ", " + std::to_string(v[i].second) + ")";
  }
  return out + "]";
}

KernelMetadata parse_kernel(const json& k, std::size_t index, const std::string& manifest_path) {
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
  m.cubin = w.string(k, "cubin");
  m.sha256 = w.string(k, "sha256");
  const json& target = w.need(k, "target", "an object");
  if (!target.is_object()) w.fail(BundleRule::kBadType, "target", "an object", describe(target));
  const Where wt(manifest_path, place + ": target", prefix + ".target.");
  m.backend = wt.string(target, "backend");
  const std::int64_t arch = wt.integer(target, "arch");
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
    w.fail(BundleRule::kBadValue, "cubin",
           "a file name inside the bundle folder (no path separators, no directories; letters, digits, '.', '_', "
           "'-'; at most 255 bytes)",
           show_string(m.cubin));
  }
  if (m.backend != "cuda") w.fail(BundleRule::kBadValue, "target.backend", "\"cuda\"", show_string(m.backend));
  w.range("target.arch", arch, 10, 999);
  m.arch = static_cast<int>(arch);
  if (warp_size != 32) w.fail(BundleRule::kBadValue, "target.warp_size", "32", std::to_string(warp_size));
  m.warp_size = 32;
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
  const std::string want_cubin = m.key + ".sm" + std::to_string(m.arch) + ".cubin";
  if (m.cubin != want_cubin) {
    w.fail(BundleRule::kKeyMismatch, "cubin", show_string(want_cubin), show_string(m.cubin),
           "the cubin file is not this variant's; rebuild the bundle");
  }
  return m;
}

// Rules C2-C6 for a cubin's bytes (docs/bundle-format.md, "Cubins").
void check_image(const KernelMetadata& m, const std::string& manifest_path, const std::string& place,
                 const std::vector<unsigned char>& image) {
  const std::string prefix = "kernels[" + std::to_string(m.index) + "].";
  const std::string cubin = "cubin \"" + printable(m.cubin_path, 4096) + "\" (" + std::to_string(image.size()) + " bytes)";
  auto fail = [&](BundleRule rule, const std::string& field, const std::string& expected, const std::string& found,
                  const std::string& text) {
    throw BundleError(rule, m.cubin_path, prefix + field, expected, found,
                      printable(manifest_path, 4096) + ": " + place + ": " + text + "; " + kFixRebuild);
  };
  if (image.empty()) {
    fail(BundleRule::kTruncated, "cubin", "a cubin", "an empty file", cubin + " is empty: truncated");
  }
  elf::CubinInfo info;
  try {
    info = elf::parse_cubin(image.data(), image.size());
  } catch (const elf::ElfError& e) {
    fail(e.rule(), "cubin", "a whole, well-formed CUDA ELF cubin", e.what(), cubin + ": " + e.what());
  }
  const std::string digest = sha256_hex(image.data(), image.size());
  if (digest != m.sha256) {
    fail(BundleRule::kSha256, "sha256", m.sha256, digest,
         "field \"sha256\": expected " + m.sha256 + " (as recorded), found " + digest + " for " + cubin +
             ": the cubin was modified or the manifest belongs to another build");
  }
  const std::vector<const elf::Symbol*> syms = info.entry_symbols(m.entry);
  if (syms.size() != 1) {
    fail(BundleRule::kNoEntrySymbol, "entry", "one global function symbol \"" + m.entry + "\" in the cubin",
         std::to_string(syms.size()) + " such symbols",
         "field \"entry\": expected one global function symbol \"" + m.entry + "\" in " + cubin + ", found " +
             std::to_string(syms.size()));
  }
  if (info.arch != m.arch) {
    fail(BundleRule::kArch, "target.arch", "sm_" + std::to_string(info.arch) + " (the cubin's)",
         "sm_" + std::to_string(m.arch),
         "field \"target.arch\": expected sm_" + std::to_string(info.arch) + " (the arch " + cubin +
             " was compiled for, from its ELF e_flags), found sm_" + std::to_string(m.arch));
  }
  // The parameter records of one .nv.info (the kernel's, or its Mercury copy's: `where`) against
  // the manifest: count, ordinals, layout. Returns the layout.
  auto check_records = [&](const elf::FunctionInfo& fi, const std::string& where) {
    std::vector<elf::KernelParam> params = fi.params;
    std::stable_sort(params.begin(), params.end(),
                     [](const elf::KernelParam& a, const elf::KernelParam& b) { return a.ordinal < b.ordinal; });
    const auto want = param_layout(m);
    if (params.size() != want.size()) {
      fail(BundleRule::kParamMismatch, "num_params",
           std::to_string(params.size()) + " (the cubin's own parameter count for " + m.entry + where + ")",
           std::to_string(m.num_params),
           "field \"num_params\": expected " + std::to_string(params.size()) + " (the parameter count of \"" +
               m.entry + "\"" + where + " in " + cubin +
               ", its .nv.info records: what cuFuncGetParamInfo reports), found " + std::to_string(m.num_params) +
               " (len(signature) " + std::to_string(m.signature.size()) + " + num_trailing_scratch_ptrs " +
               std::to_string(m.num_trailing_scratch_ptrs) + ")");
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].ordinal != i) {
        fail(BundleRule::kParamMismatch, "num_params",
             "parameter ordinals 0.." + std::to_string(params.size() - 1) + " once each" + where,
             "ordinal " + std::to_string(params[i].ordinal) + " at position " + std::to_string(i),
             "field \"num_params\": the parameter records of \"" + m.entry + "\"" + where + " in " + cubin +
                 " do not number 0.." + std::to_string(params.size() - 1) + " once each");
      }
    }
    std::vector<std::pair<std::uint32_t, std::uint32_t>> got;
    for (const auto& q : params) got.emplace_back(q.offset, q.size);
    if (got != want) {
      fail(BundleRule::kParamMismatch, "signature",
           "parameters (offset, size) " + layout_text(got) + " (the cubin's" + where + ")",
           layout_text(want) + " from the manifest",
           "field \"signature\": expected the parameters (offset, size) of \"" + m.entry + "\"" + where + " in " +
               cubin + ", " + layout_text(got) + ", found " + layout_text(want) +
               " from the signature and the trailing scratch pointers: an ABI mismatch");
    }
    return want;
  };
  const std::uint64_t threads = static_cast<std::uint64_t>(m.num_warps) * static_cast<std::uint64_t>(m.warp_size);
  auto check_block = [&](const elf::FunctionInfo& fi, const std::string& where) {
    for (const bool required : {true, false}) {
      const auto& dims = required ? fi.reqntid : fi.max_threads;
      if (!dims) continue;
      const std::uint64_t block = std::uint64_t{(*dims)[0]} * (*dims)[1] * (*dims)[2];
      if (required ? block != threads : block < threads) {
        const std::string expected = std::string(required ? "" : "at most ") + std::to_string(block) +
                                     " threads (the cubin's " + (required ? "required" : "maximum") + " block " +
                                     std::to_string((*dims)[0]) + "x" + std::to_string((*dims)[1]) + "x" +
                                     std::to_string((*dims)[2]) + where + ")";
        fail(BundleRule::kLaunchShape, "num_warps", expected,
             std::to_string(threads) + " (num_warps " + std::to_string(m.num_warps) + ")",
             "field \"num_warps\": expected " + expected + ", found " + std::to_string(threads) +
                 " threads (num_warps " + std::to_string(m.num_warps) + " x warp_size " +
                 std::to_string(m.warp_size) + ")");
      }
    }
  };
  auto infos = info.function_info.find(syms[0]->shndx);
  const std::size_t n_infos = infos == info.function_info.end() ? 0 : infos->second.size();
  if (n_infos != 1) {
    fail(BundleRule::kParamMismatch, "num_params", "one .nv.info section for " + m.entry, std::to_string(n_infos),
         "field \"num_params\": expected one .nv.info section describing \"" + m.entry + "\" in " + cubin +
             ", found " + std::to_string(n_infos));
  }
  const elf::FunctionInfo& fi = infos->second[0];
  const auto want = check_records(fi, "");
  const std::uint32_t end = want.empty() ? 0 : want.back().first + want.back().second;
  if (fi.cbank_param_size && *fi.cbank_param_size != end) {
    fail(BundleRule::kParamMismatch, "signature", std::to_string(end) + " bytes of parameters",
         std::to_string(*fi.cbank_param_size) + " in the cubin",
         "field \"signature\": expected " + std::to_string(end) + " bytes of parameters, found " +
             std::to_string(*fi.cbank_param_size) + " in " + cubin + " (EIATTR_CBANK_PARAM_SIZE)");
  }
  if (fi.param_cbank) {
    const elf::Symbol& s = info.symbols[fi.param_cbank->symbol];
    const elf::Section* bank = s.shndx > 0 && s.shndx < info.sections.size() ? &info.sections[s.shndx] : nullptr;
    if (fi.param_cbank->size != end || bank == nullptr ||
        std::uint64_t{fi.param_cbank->offset} + fi.param_cbank->size > bank->size) {
      fail(BundleRule::kParamMismatch, "signature", "a parameter bank of " + std::to_string(end) + " bytes inside its section",
           std::to_string(fi.param_cbank->size) + " bytes at " + std::to_string(fi.param_cbank->offset),
           "field \"signature\": expected a parameter bank of " + std::to_string(end) + " bytes inside its section, found " +
               std::to_string(fi.param_cbank->size) + " bytes at " + std::to_string(fi.param_cbank->offset) + " in " +
               cubin + " (EIATTR_PARAM_CBANK)");
    }
  }
  check_block(fi, "");
  // The Mercury copy of the kernel (sm_100 and later), which the driver may finalize instead of
  // the SASS: its own .nv.merc.nv.info must describe the same parameters and block.
  for (const elf::Symbol* msym : info.merc_entry_symbols(m.entry)) {
    auto minfos = info.merc_function_info.find(msym->shndx);
    const std::size_t n_minfos = minfos == info.merc_function_info.end() ? 0 : minfos->second.size();
    if (n_minfos != 1) {
      fail(BundleRule::kParamMismatch, "num_params", "one .nv.merc.nv.info section for " + m.entry + "'s Mercury code",
           std::to_string(n_minfos),
           "field \"num_params\": expected one .nv.merc.nv.info section describing the Mercury code of \"" + m.entry +
               "\" in " + cubin + ", found " + std::to_string(n_minfos));
    }
    check_records(minfos->second[0], " (its Mercury copy)");
    check_block(minfos->second[0], " (its Mercury copy)");
  }
}

}  // namespace

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

void check_cubin_image(const KernelMetadata& m, const std::vector<unsigned char>& image) {
  const std::string manifest_path = m.cubin_state_ ? m.cubin_state_->manifest_path : std::string("manifest.json");
  const std::string place = m.cubin_state_ ? m.cubin_state_->place : "kernels[" + std::to_string(m.index) + "]";
  check_image(m, manifest_path, place, image);
}

const std::vector<unsigned char>& KernelMetadata::image() const {
  if (!cubin_state_) {
    throw Error(Status::kInvalidArgument, "the kernel metadata of key \"" + key +
                                              "\" was not read from a manifest (AotManifest::load): it has no cubin");
  }
  Cubin& c = *cubin_state_;
  if (c.verified.load(std::memory_order_acquire)) return c.bytes;
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.verified.load(std::memory_order_relaxed)) {
    std::vector<unsigned char> bytes = read_bundle_file(c.dir, cubin, kCubinMaxBytes, c.prefix + ".cubin");
    check_image(*this, c.manifest_path, c.place, bytes);
    c.bytes = std::move(bytes);
    c.verified.store(true, std::memory_order_release);
  }
  return c.bytes;
}

bool KernelMetadata::image_verified() const noexcept {
  return cubin_state_ != nullptr && cubin_state_->verified.load(std::memory_order_acquire);
}

std::string sha256_hex(const void* data, std::size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, size, md, &len, EVP_sha256(), nullptr) != 1 || len != 32) {
    throw Error(Status::kInternal, "OpenSSL EVP_Digest(SHA-256) failed");
  }
  static const char* hex = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned i = 0; i < 32; ++i) {
    out[2 * i] = hex[md[i] >> 4];
    out[2 * i + 1] = hex[md[i] & 15];
  }
  return out;
}

std::size_t KernelMetadata::global_scratch_bytes(unsigned grid_x, unsigned grid_y, unsigned grid_z) const {
  return triton_scratch_bytes(global_scratch_size, num_ctas, grid_x, grid_y, grid_z, "global scratch");
}

std::size_t KernelMetadata::profile_scratch_bytes(unsigned grid_x, unsigned grid_y, unsigned grid_z) const {
  return triton_scratch_bytes(profile_scratch_size, num_ctas, grid_x, grid_y, grid_z, "profile scratch");
}

AotManifest AotManifest::load(const std::string& dir, CubinCheck cubins) {
  const std::vector<unsigned char> bytes = read_bundle_file(dir, "manifest.json", kManifestMaxBytes, "(file)");
  return parse(std::string(bytes.begin(), bytes.end()), dir, bundle_path(dir, "manifest.json"), cubins);
}

AotManifest AotManifest::parse(const std::string& json_text, const std::string& dir, const std::string& manifest_path,
                               CubinCheck cubins) {
  const Where top(manifest_path, "", "");
  json doc;
  try {
    doc = parse_manifest_json(json_text);
  } catch (const ManifestJsonError& e) {
    throw BundleError(BundleRule::kBadJson, manifest_path, "(file)", "valid UTF-8 JSON of the manifest profile",
                      e.what(),
                      printable(manifest_path, 4096) + ": not valid JSON of the manifest profile (" + e.what() + "); " +
                          kFixRebuild);
  }
  // T1
  if (!doc.is_object()) {
    throw BundleError(BundleRule::kBadType, manifest_path, "(top level)", "a JSON object", describe(doc),
                      printable(manifest_path, 4096) + ": expected a JSON object at the top level, found " +
                          describe(doc));
  }
  AotManifest out;
  out.dir_ = dir;
  out.manifest_path_ = manifest_path;
  try {
    // T2
    auto fmt = doc.find("format");
    if (fmt == doc.end() || !fmt->is_string() || fmt->get<std::string>() != kAotBundleFormat) {
      top.fail(BundleRule::kFormat, "format", std::string("\"") + kAotBundleFormat + "\"",
               fmt == doc.end() ? std::string("nothing (the field is missing)") : describe(*fmt),
               "this is not a LuminaMoon kernel bundle");
    }
    // T3
    auto fv = doc.find("format_version");
    const std::string want_version = "an integer in 1.." + std::to_string(kAotBundleFormatVersion);
    if (fv == doc.end()) top.fail(BundleRule::kFormatVersion, "format_version", want_version, "nothing (the field is missing)");
    if (!fv->is_number_integer()) top.fail(BundleRule::kBadType, "format_version", "an integer", describe(*fv));
    const std::int64_t version = fv->get<std::int64_t>();
    if (version < 1 || version > kAotBundleFormatVersion) {
      top.fail(BundleRule::kFormatVersion, "format_version",
               want_version + " (" + std::to_string(kAotBundleFormatVersion) + " is the newest this luminav reads)",
               describe(*fv),
               version > kAotBundleFormatVersion
                   ? "update luminav, or build the bundle with a luminamoon that matches it"
                   : kFixRebuild);
    }
    out.format_version_ = static_cast<int>(version);
    // T4-T7
    if (version >= 2) {
      const std::int64_t cols = top.integer(doc, "table_cols");
      top.range("table_cols", cols, 1, 4096);
      out.table_cols_ = static_cast<int>(cols);
    } else {
      out.table_cols_ = kAotBundleV1TableCols;
    }
    out.created_by_ = top.string(doc, "created_by");
    out.triton_version_ = top.string(doc, "triton_version");
    if (!is_version(out.triton_version_)) {
      top.fail(BundleRule::kBadValue, "triton_version", "a version such as \"3.6.0\"", show_string(out.triton_version_));
    }
    const json& kernels = top.need(doc, "kernels", "an array");
    if (!kernels.is_array()) top.fail(BundleRule::kBadType, "kernels", "an array", describe(kernels));
    if (kernels.empty()) top.fail(BundleRule::kBadValue, "kernels", "at least one kernel variant", "an empty array", kFixRebuild);
    // T8
    std::map<std::pair<std::string, int>, std::size_t> first;
    for (std::size_t i = 0; i < kernels.size(); ++i) {
      KernelMetadata m = parse_kernel(kernels[i], i, manifest_path);
      const auto id = std::make_pair(m.key, m.arch);
      auto [at, inserted] = first.emplace(id, i);
      if (!inserted) {
        Where(manifest_path, "", "").fail(BundleRule::kDuplicate, "kernels[" + std::to_string(i) + "]",
                                          "one entry per (key, arch)",
                                          "a second " + show_string(m.key) + " for arch " + std::to_string(m.arch) +
                                              " (first at kernels[" + std::to_string(at->second) + "])");
      }
      m.cubin_state_ = std::make_shared<KernelMetadata::Cubin>();
      m.cubin_state_->manifest_path = manifest_path;
      m.cubin_state_->place = "kernels[" + std::to_string(i) + "] (key " + show_string(m.key) + ")";
      m.cubin_state_->prefix = "kernels[" + std::to_string(i) + "]";
      m.cubin_state_->dir = dir;
      m.cubin_path = bundle_path(dir, m.cubin);
      out.kernels_.push_back(std::move(m));
    }
  } catch (const BundleError&) {
    throw;
  } catch (const json::exception& e) {
    // Every access above checks types first; this is a last line so a corrupt manifest can
    // never escape as anything but a bundle error.
    throw BundleError(BundleRule::kBadJson, manifest_path, "(file)", "a well-formed manifest", printable(e.what()),
                      printable(manifest_path, 4096) + ": malformed manifest (" + printable(e.what()) + ")");
  }
  // C1: the cubins exist as regular files of at most kCubinMaxBytes (one stat each); with
  // kNow each is also read and checked, in manifest order, as Python's load_bundle does.
  for (KernelMetadata& m : out.kernels_) {
    if (cubins == CubinCheck::kNow) {
      (void)m.image();
    } else {
      m.cubin_bytes = stat_bundle_file(dir, m.cubin, kCubinMaxBytes, m.cubin_state_->prefix + ".cubin");
    }
  }
  if (cubins == CubinCheck::kNow) {
    for (KernelMetadata& m : out.kernels_) m.cubin_bytes = m.image().size();
  }
  return out;
}

void AotManifest::verify_cubins() const {
  for (const KernelMetadata& m : kernels_) (void)m.image();
}

const KernelMetadata* AotManifest::find(const std::string& key, int arch_major, int arch_minor) const noexcept {
  const KernelMetadata* best = nullptr;
  for (const KernelMetadata& m : kernels_) {
    if (m.key != key || !m.runs_on(arch_major, arch_minor)) continue;
    if (best == nullptr || m.arch_minor() > best->arch_minor()) best = &m;
  }
  return best;
}

std::vector<int> AotManifest::archs_for(const std::string& key) const {
  std::vector<int> archs;
  for (const KernelMetadata& m : kernels_) {
    if (m.key == key) archs.push_back(m.arch);
  }
  std::sort(archs.begin(), archs.end());
  return archs;
}

std::vector<std::string> AotManifest::keys() const {
  std::set<std::string> keys;
  for (const KernelMetadata& m : kernels_) keys.insert(m.key);
  return {keys.begin(), keys.end()};
}

const KernelMetadata& AotManifest::require(const std::string& key, int arch_major, int arch_minor) const {
  if (const KernelMetadata* m = find(key, arch_major, arch_minor)) return *m;
  const std::string device_arch = std::to_string(arch_major) + std::to_string(arch_minor);
  const std::vector<int> archs = archs_for(key);
  std::string msg = manifest_path_ + ": no kernel variant \"" + printable(key) + "\" for a device of compute capability " +
                    std::to_string(arch_major) + "." + std::to_string(arch_minor) + " (sm_" + device_arch + "); ";
  if (archs.empty()) {
    msg += "the bundle has no variant with this key";
  } else {
    msg += "the bundle has it for";
    for (std::size_t i = 0; i < archs.size(); ++i) msg += (i ? ", sm_" : " sm_") + std::to_string(archs[i]);
    msg += " (a cubin runs only on the same major and an equal or newer minor)";
  }
  msg += "; fix: luminamoon aot build --arch " + device_arch + " --out " + dir_;
  throw Error(Status::kNotFound, msg);
}

}  // namespace luminav

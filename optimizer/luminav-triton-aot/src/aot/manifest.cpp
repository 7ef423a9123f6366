// src/aot/manifest.cpp: reads and checks a bundle's manifest (format "luminamoon-aot-bundle",
// format_version 1 and 2) and its cubins' ELF structure and SHA-256 (on first use, or all at
// once), and finds a variant by (key, device arch)
#include <openssl/evp.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "aot/manifest.h"
#include "luminav/error.h"

namespace luminav {

struct KernelMetadata::Cubin {
  std::string manifest_path, place;  // where the entry sits, for messages
  std::string path, sha256;
  std::mutex mutex;                  // held while the file is read and checked
  std::atomic<bool> verified{false};
  std::vector<unsigned char> bytes;  // written once, under `mutex`, before `verified`
};

namespace {

using json = nlohmann::json;

const char* const kKernelKinds[] = {"pass1", "reduce", "pass2", "single_pass", "commit"};

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
  std::string text = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return type + " " + text;
}

// Where in the manifest a value sits, for messages: "<file>: kernels[3] (key \"...\")".
class Where {
 public:
  Where(std::string file, std::string place) : file_(std::move(file)), place_(std::move(place)) {}
  [[noreturn]] void fail(const std::string& field, const std::string& expected, const std::string& found) const {
    std::string msg = file_ + ": ";
    if (!place_.empty()) msg += place_ + ": ";
    msg += "field \"" + field + "\": expected " + expected + ", found " + found;
    throw Error(Status::kBundleError, msg);
  }
  [[noreturn]] void fail_text(const std::string& text) const {
    std::string msg = file_ + ": ";
    if (!place_.empty()) msg += place_ + ": ";
    throw Error(Status::kBundleError, msg + text);
  }
  const json& field(const json& obj, const std::string& name, const std::string& expected) const {
    auto it = obj.find(name);
    if (it == obj.end()) fail(name, expected, "nothing (the field is missing)");
    return *it;
  }
  std::string string(const json& obj, const std::string& name, bool allow_empty = false) const {
    const json& v = field(obj, name, "a string");
    if (!v.is_string()) fail(name, "a string", describe(v));
    std::string s = v.get<std::string>();
    if (s.empty() && !allow_empty) fail(name, "a non-empty string", "an empty string");
    return s;
  }
  std::int64_t integer(const json& obj, const std::string& name, std::int64_t lo, std::int64_t hi) const {
    const std::string expected =
        "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    const json& v = field(obj, name, expected);
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(hi) || static_cast<std::int64_t>(u) < lo) fail(name, expected, describe(v));
      return static_cast<std::int64_t>(u);
    }
    if (!v.is_number_integer()) fail(name, expected, describe(v));
    const auto i = v.get<std::int64_t>();
    if (i < lo || i > hi) fail(name, expected, describe(v));
    return i;
  }
  std::vector<std::string> strings(const json& obj, const std::string& name) const {
    const json& v = field(obj, name, "an array of strings");
    if (!v.is_array()) fail(name, "an array of strings", describe(v));
    std::vector<std::string> out;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string()) fail(name + "[" + std::to_string(i) + "]", "a string", describe(v[i]));
      out.push_back(v[i].get<std::string>());
    }
    return out;
  }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::string place_;
};

bool is_power_of_two(std::int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

bool is_lower_hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// Reads a whole file. Returns false when it cannot be opened.
bool read_file(const std::string& path, std::vector<unsigned char>& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return !f.bad();
}

template <typename T>
T read_le(const std::vector<unsigned char>& b, std::size_t off) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | (static_cast<T>(b[off + i]) << (8 * i)));
  return v;
}

// Checks that a cubin is a whole 64-bit little-endian ELF image: every section's data, the
// section header table and the program header table lie inside the file. A cubin cut short
// (a partial copy, a full disk) fails here with the byte counts, before the hash is compared.
void check_elf(const Where& where, const std::string& path, const std::vector<unsigned char>& b) {
  const std::uint64_t size = b.size();
  auto fail = [&](const std::string& what) {
    where.fail_text("cubin \"" + path + "\" (" + std::to_string(size) + " bytes) " + what +
                    "; rebuild the bundle (luminamoon aot build) or copy it again");
  };
  if (size < 64) fail("is too short for an ELF header (64 bytes): truncated");
  if (!(b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F')) fail("is not an ELF file (no \\x7fELF magic)");
  if (b[4] != 2 || b[5] != 1) fail("is not a 64-bit little-endian ELF file");
  const auto machine = read_le<std::uint16_t>(b, 0x12);
  if (machine != 190 /* EM_CUDA */) {
    fail("is an ELF file for machine " + std::to_string(machine) + ", not a CUDA cubin (EM_CUDA, 190)");
  }
  const auto phoff = read_le<std::uint64_t>(b, 0x20);
  const auto shoff = read_le<std::uint64_t>(b, 0x28);
  const auto phentsize = read_le<std::uint16_t>(b, 0x36);
  const auto phnum = read_le<std::uint16_t>(b, 0x38);
  const auto shentsize = read_le<std::uint16_t>(b, 0x3A);
  const auto shnum = read_le<std::uint16_t>(b, 0x3C);
  auto table_end = [](std::uint64_t off, std::uint64_t n, std::uint64_t ent) -> std::uint64_t {
    if (n == 0) return 0;
    if (off > std::numeric_limits<std::uint64_t>::max() / 2 || ent * n > std::numeric_limits<std::uint64_t>::max() / 2)
      return std::numeric_limits<std::uint64_t>::max();
    return off + ent * n;
  };
  const std::uint64_t sh_end = table_end(shoff, shnum, shentsize);
  if (sh_end > size) {
    fail("is truncated: its section header table ends at byte " + std::to_string(sh_end));
  }
  const std::uint64_t ph_end = table_end(phoff, phnum, phentsize);
  if (ph_end > size) {
    fail("is truncated: its program header table ends at byte " + std::to_string(ph_end));
  }
  if (shnum > 0 && shentsize < 64) fail("has a malformed section header size (" + std::to_string(shentsize) + ")");
  for (std::uint64_t i = 0; i < shnum; ++i) {
    const std::uint64_t h = shoff + i * shentsize;
    const auto type = read_le<std::uint32_t>(b, h + 4);
    const auto off = read_le<std::uint64_t>(b, h + 0x18);
    const auto sz = read_le<std::uint64_t>(b, h + 0x20);
    if (type == 8 /* SHT_NOBITS */ || type == 0 /* SHT_NULL */) continue;
    if (off > size || sz > size - off) {
      fail("is truncated: section " + std::to_string(i) + " ends at byte " +
           std::to_string(off > std::numeric_limits<std::uint64_t>::max() - sz ? off : off + sz));
    }
  }
}

[[noreturn]] void fail_missing_cubin(const Where& w, const std::string& path, int err) {
  w.fail("cubin", "a readable file \"" + path + "\"",
         "no such file (" + std::string(std::strerror(err)) + "); rebuild the bundle (luminamoon aot build)");
}

[[noreturn]] void fail_empty_cubin(const Where& w, const std::string& path) {
  w.fail_text("cubin \"" + path + "\" is empty (0 bytes); rebuild the bundle (luminamoon aot build)");
}

// The size of a cubin file, which must exist, be a regular file, and not be empty.
std::uint64_t stat_cubin(const Where& w, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail_missing_cubin(w, path, errno);
  if (!S_ISREG(st.st_mode)) {
    w.fail("cubin", "a regular file \"" + path + "\"", "something else (a directory or a device); rebuild the "
           "bundle (luminamoon aot build)");
  }
  if (st.st_size == 0) fail_empty_cubin(w, path);
  return static_cast<std::uint64_t>(st.st_size);
}

// Reads a cubin and checks it is a whole ELF image with the recorded hash.
std::vector<unsigned char> read_verified_cubin(const Where& w, const std::string& path, const std::string& sha256) {
  std::vector<unsigned char> image;
  if (!read_file(path, image)) fail_missing_cubin(w, path, errno);
  if (image.empty()) fail_empty_cubin(w, path);
  check_elf(w, path, image);
  const std::string digest = sha256_hex(image.data(), image.size());
  if (digest != sha256) {
    w.fail("sha256", sha256 + " (as recorded)", digest + " for \"" + path + "\" (" + std::to_string(image.size()) +
           " bytes): the cubin was modified or the manifest belongs to another build; rebuild the bundle "
           "(luminamoon aot build)");
  }
  return image;
}

KernelMetadata parse_kernel(const json& k, std::size_t index, const std::string& manifest_path,
                            const std::string& dir) {
  std::string place = "kernels[" + std::to_string(index) + "]";
  if (!k.is_object()) Where(manifest_path, place).fail_text("expected an object, found " + describe(k));
  // Name the variant in every later message when its key is readable.
  auto key_it = k.find("key");
  if (key_it != k.end() && key_it->is_string()) place += " (key \"" + key_it->get<std::string>() + "\")";
  const Where w(manifest_path, place);

  KernelMetadata m;
  m.key = w.string(k, "key");
  m.kernel = w.string(k, "kernel");
  if (std::find(std::begin(kKernelKinds), std::end(kKernelKinds), m.kernel) == std::end(kKernelKinds)) {
    w.fail("kernel", "one of pass1, reduce, pass2, single_pass, commit", "\"" + m.kernel + "\"");
  }
  m.name = w.string(k, "name");
  m.entry = w.string(k, "entry");
  m.cubin = w.string(k, "cubin");
  if (m.cubin.find('/') != std::string::npos || m.cubin.find('\\') != std::string::npos || m.cubin == "." ||
      m.cubin == "..") {
    w.fail("cubin", "a file name inside the bundle folder (no path separators)", "\"" + m.cubin + "\"");
  }
  m.sha256 = w.string(k, "sha256");
  if (!is_lower_hex64(m.sha256)) w.fail("sha256", "64 lowercase hex digits", "\"" + m.sha256 + "\"");

  const json& target = w.field(k, "target", "an object {backend, arch, warp_size}");
  if (!target.is_object()) w.fail("target", "an object {backend, arch, warp_size}", describe(target));
  const Where wt(manifest_path, place + ": target");
  m.backend = wt.string(target, "backend");
  if (m.backend != "cuda") wt.fail("backend", "\"cuda\"", "\"" + m.backend + "\"");
  m.arch = static_cast<int>(wt.integer(target, "arch", 10, 999));
  m.warp_size = static_cast<int>(wt.integer(target, "warp_size", 32, 32));

  m.triton_version = w.string(k, "triton_version");
  m.num_warps = static_cast<int>(w.integer(k, "num_warps", 1, 32));
  if (!is_power_of_two(m.num_warps)) w.fail("num_warps", "a power of two in [1, 32]", std::to_string(m.num_warps));
  m.num_ctas = static_cast<int>(w.integer(k, "num_ctas", 1, 16));
  m.num_stages = static_cast<int>(w.integer(k, "num_stages", 0, 64));
  m.shared_mem = w.integer(k, "shared_mem", 0, std::numeric_limits<std::int32_t>::max());

  m.arg_names = w.strings(k, "arg_names");
  m.signature = w.strings(k, "signature");
  if (m.arg_names.size() != m.signature.size()) {
    w.fail("signature", "one type word per arg_names entry (" + std::to_string(m.arg_names.size()) + ")",
           std::to_string(m.signature.size()) + " entries");
  }
  for (std::size_t i = 0; i < m.signature.size(); ++i) {
    try {
      m.arg_types.push_back(ArgType::parse(m.signature[i]));
    } catch (const Error& e) {
      w.fail("signature[" + std::to_string(i) + "]", "a Triton type word (i32, i64, u32, u64, fp16, bf16, fp32, "
             "fp64, i1, or * followed by one of these)", "\"" + m.signature[i] + "\" (" + e.what() + ")");
    }
  }

  const json& cx = w.field(k, "constexprs", "an object of integers");
  if (!cx.is_object()) w.fail("constexprs", "an object of integers", describe(cx));
  for (auto it = cx.begin(); it != cx.end(); ++it) {
    const json& v = it.value();
    if (v.is_boolean()) {
      m.constexprs[it.key()] = v.get<bool>() ? 1 : 0;
    } else if (v.is_number_integer() && !(v.is_number_unsigned() &&
                                           v.get<std::uint64_t>() > static_cast<std::uint64_t>(
                                                                         std::numeric_limits<std::int64_t>::max()))) {
      m.constexprs[it.key()] = v.get<std::int64_t>();
    } else {
      w.fail("constexprs." + it.key(), "an integer or a boolean", describe(v));
    }
  }

  m.num_params = static_cast<int>(w.integer(k, "num_params", 0, 4096));
  m.num_trailing_scratch_ptrs = static_cast<int>(w.integer(k, "num_trailing_scratch_ptrs", 0, 2));
  const std::int64_t expected_params =
      static_cast<std::int64_t>(m.signature.size()) + m.num_trailing_scratch_ptrs;
  if (m.num_params != expected_params) {
    w.fail("num_params",
           std::to_string(expected_params) + " (len(signature) " + std::to_string(m.signature.size()) +
               " + num_trailing_scratch_ptrs " + std::to_string(m.num_trailing_scratch_ptrs) + ")",
           std::to_string(m.num_params));
  }
  const std::int64_t kMaxScratch = std::int64_t{1} << 40;
  m.global_scratch_size = w.integer(k, "global_scratch_size", 0, kMaxScratch);
  m.global_scratch_align = w.integer(k, "global_scratch_align", 1, 1 << 20);
  m.profile_scratch_size = w.integer(k, "profile_scratch_size", 0, kMaxScratch);
  m.profile_scratch_align = w.integer(k, "profile_scratch_align", 1, 1 << 20);
  if (!is_power_of_two(m.global_scratch_align)) {
    w.fail("global_scratch_align", "a power of two", std::to_string(m.global_scratch_align));
  }
  if (!is_power_of_two(m.profile_scratch_align)) {
    w.fail("profile_scratch_align", "a power of two", std::to_string(m.profile_scratch_align));
  }
  if (m.global_scratch_size > 0 && m.num_trailing_scratch_ptrs < 1) {
    w.fail("num_trailing_scratch_ptrs", "at least 1 (global_scratch_size is " +
           std::to_string(m.global_scratch_size) + ", which needs the global_scratch parameter)", "0");
  }
  if (m.profile_scratch_size > 0 && m.num_trailing_scratch_ptrs < 2) {
    w.fail("num_trailing_scratch_ptrs", "2 (profile_scratch_size is " + std::to_string(m.profile_scratch_size) +
           ", which needs the profile_scratch parameter)", std::to_string(m.num_trailing_scratch_ptrs));
  }

  // The cubin: present and non-empty now (one stat); its bytes are read and checked when the
  // kernel is first loaded (KernelMetadata::image), so a step reads only the cubins it runs.
  m.cubin_path = join_path(dir, m.cubin);
  m.cubin_bytes = stat_cubin(w, m.cubin_path);
  return m;
}

}  // namespace

const std::vector<unsigned char>& KernelMetadata::image() const {
  if (!cubin_state_) {
    throw Error(Status::kInvalidArgument, "the kernel metadata of key \"" + key +
                                              "\" was not read from a manifest (AotManifest::load): it has no cubin");
  }
  Cubin& c = *cubin_state_;
  if (c.verified.load(std::memory_order_acquire)) return c.bytes;
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.verified.load(std::memory_order_relaxed)) {
    c.bytes = read_verified_cubin(Where(c.manifest_path, c.place), c.path, c.sha256);
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
  const std::string path = join_path(dir, "manifest.json");
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    throw Error(Status::kBundleError, path + ": cannot open the bundle manifest (" + std::strerror(errno) +
                                          "); build a bundle with `luminamoon aot build --arch <major><minor> --out " +
                                          dir + "`");
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), dir, path, cubins);
}

AotManifest AotManifest::parse(const std::string& json_text, const std::string& dir, const std::string& manifest_path,
                               CubinCheck cubins) {
  const Where top(manifest_path, "");
  if (json_text.empty()) top.fail_text("the manifest is empty (0 bytes); rebuild the bundle (luminamoon aot build)");
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    top.fail_text(std::string("not valid JSON (") + e.what() + "); rebuild the bundle (luminamoon aot build)");
  }
  if (!doc.is_object()) top.fail_text("expected a JSON object at the top level, found " + describe(doc));

  AotManifest out;
  out.dir_ = dir;
  out.manifest_path_ = manifest_path;
  try {
    const std::string format = top.string(doc, "format");
    if (format != kAotBundleFormat) {
      top.fail("format", std::string("\"") + kAotBundleFormat + "\"", "\"" + format + "\"");
    }
    const json& fv = top.field(doc, "format_version", "an integer");
    if (!fv.is_number_integer()) top.fail("format_version", "an integer", describe(fv));
    if (fv.is_number_unsigned() ? fv.get<std::uint64_t>() > static_cast<std::uint64_t>(kAotBundleFormatVersion)
                                : fv.get<std::int64_t>() > kAotBundleFormatVersion) {
      top.fail("format_version",
               "at most " + std::to_string(kAotBundleFormatVersion) + " (the newest this luminav reads)",
               describe(fv) + "; update luminav, or build the bundle with a luminamoon that matches it");
    }
    out.format_version_ = static_cast<int>(top.integer(doc, "format_version", 1, kAotBundleFormatVersion));
    out.table_cols_ = out.format_version_ >= 2 ? static_cast<int>(top.integer(doc, "table_cols", 1, 4096))
                                               : kAotBundleV1TableCols;
    out.created_by_ = top.string(doc, "created_by", true);
    out.triton_version_ = top.string(doc, "triton_version", true);
    const json& kernels = top.field(doc, "kernels", "an array of kernel variants");
    if (!kernels.is_array()) top.fail("kernels", "an array of kernel variants", describe(kernels));
    if (kernels.empty()) top.fail("kernels", "at least one kernel variant", "an empty array");

    std::set<std::pair<std::string, int>> seen;
    for (std::size_t i = 0; i < kernels.size(); ++i) {
      KernelMetadata m = parse_kernel(kernels[i], i, manifest_path, dir);
      m.cubin_state_ = std::make_shared<KernelMetadata::Cubin>();
      m.cubin_state_->manifest_path = manifest_path;
      m.cubin_state_->place = "kernels[" + std::to_string(i) + "] (key \"" + m.key + "\")";  // as parse_kernel names it
      m.cubin_state_->path = m.cubin_path;
      m.cubin_state_->sha256 = m.sha256;
      if (!seen.insert({m.key, m.arch}).second) {
        Where(manifest_path, "kernels[" + std::to_string(i) + "]")
            .fail("key", "one entry per (key, arch)", "a second \"" + m.key + "\" for arch " + std::to_string(m.arch));
      }
      out.kernels_.push_back(std::move(m));
    }
  } catch (const json::exception& e) {
    // Every access above checks types first; this is a last line so a corrupt manifest can
    // never escape as anything but a bundle error.
    top.fail_text(std::string("malformed manifest (") + e.what() + ")");
  }
  if (cubins == CubinCheck::kNow) out.verify_cubins();
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
  std::string msg = manifest_path_ + ": no kernel variant \"" + key + "\" for a device of compute capability " +
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

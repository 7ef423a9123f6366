// src/aot/manifest.cpp: reads and checks a bundle's manifest (format "luminamoon-aot-bundle",
// format_version 1 to 3) and its code objects (cubins; hsaco files from version 3) by the rule book of docs/bundle-format.md, in its order
// and with its reason codes (the same as python/luminamoon/aot/manifest.py), and finds a variant
// by (key, device arch); a kernels[] entry is read by manifest_kernel.cpp, a code object checked
// by manifest_cubin.cpp (CUDA) or manifest_hsaco.cpp (HIP)
#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "aot/bundle_file.h"
#include "aot/bundle_rules.h"
#include "aot/manifest.h"
#include "aot/manifest_internal.h"
#include "aot/manifest_json.h"
#include "luminav/error.h"

namespace luminav {

using namespace manifest_detail;

namespace manifest_detail {

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

}  // namespace manifest_detail

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
    std::map<std::pair<std::string, std::string>, std::size_t> first;
    for (std::size_t i = 0; i < kernels.size(); ++i) {
      KernelMetadata m = parse_kernel(kernels[i], i, manifest_path, out.format_version_);
      const auto id = std::make_pair(m.key, m.arch_label());
      auto [at, inserted] = first.emplace(id, i);
      if (!inserted) {
        Where(manifest_path, "", "").fail(BundleRule::kDuplicate, "kernels[" + std::to_string(i) + "]",
                                          "one entry per (key, arch)",
                                          "a second " + show_string(m.key) + " for arch " +
                                              (m.hip() ? m.gfx : std::to_string(m.arch)) + " (first at kernels[" +
                                              std::to_string(at->second) + "])");
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
      m.cubin_bytes = stat_bundle_file(dir, m.cubin, kCubinMaxBytes, m.cubin_state_->prefix + "." + m.file_field());
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

const KernelMetadata* AotManifest::find_hip(const std::string& key, const std::string& gfx) const noexcept {
  for (const KernelMetadata& m : kernels_) {
    if (m.hip() && m.key == key && m.gfx == gfx) return &m;
  }
  return nullptr;
}

const KernelMetadata& AotManifest::require_hip(const std::string& key, const std::string& gfx) const {
  if (const KernelMetadata* m = find_hip(key, gfx)) return *m;
  std::string have;
  for (const KernelMetadata& m : kernels_) {
    if (m.hip() && m.key == key) have += (have.empty() ? "" : ", ") + m.gfx;
  }
  throw Error(Status::kNotFound, manifest_path_ + ": no kernel variant \"" + printable(key) + "\" for a HIP device of arch " +
                                     printable(gfx) + "; " +
                                     (have.empty() ? std::string("the bundle has no HIP variant with this key")
                                                   : "the bundle has it for " + have +
                                                         " (a code object runs only on the arch it was compiled for)") +
                                     "; fix: luminamoon aot build --arch " + printable(gfx) + " --out " + dir_);
}

std::vector<int> AotManifest::archs_for(const std::string& key) const {
  std::vector<int> archs;
  for (const KernelMetadata& m : kernels_) {
    if (m.key == key && !m.hip()) archs.push_back(m.arch);
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
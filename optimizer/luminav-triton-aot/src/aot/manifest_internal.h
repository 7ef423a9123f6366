// src/aot/manifest_internal.h: what the manifest reader's parts share (manifest.cpp, the
// manifest's top level; manifest_kernel.cpp, a kernels[] entry; manifest_cubin.cpp, a variant's
// cubin): the lazily read cubin of a variant, the field reader `Where`, and the helpers of the
// messages
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "aot/bundle_rules.h"
#include "aot/manifest.h"

namespace luminav {

struct KernelMetadata::Cubin {
  std::string manifest_path, place, prefix;  // where the entry sits, for messages
  std::string dir;
  std::mutex mutex;                  // held while the file is read and checked
  std::atomic<bool> verified{false};
  std::vector<unsigned char> bytes;  // written once, under `mutex`, before `verified`
};

namespace manifest_detail {

using json = nlohmann::json;

constexpr const char* kFixRebuild = "rebuild the bundle (luminamoon aot build)";

// A JSON value described for messages (manifest.cpp).
std::string describe(const json& v);
std::string show_string(const std::string& s);

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

// <1-4 digits>.<1-4 digits>, then optionally [.+-] and [0-9A-Za-z.+_-]*; at most 64 bytes
// (manifest_kernel.cpp).
bool is_version(const std::string& s, int* major = nullptr, int* minor = nullptr);

// Rules K0-K2 for kernels[index] (manifest_kernel.cpp).
// `format_version`: the manifest's (HIP entries need 3 or later).
KernelMetadata parse_kernel(const json& k, std::size_t index, const std::string& manifest_path, int format_version);

// (offset, size) of each kernel parameter as the ABI lays them out (the same on CUDA and HIP): the
// signature's, then one 8-byte pointer per trailing scratch parameter, each aligned to its size
// (manifest_cubin.cpp); and that list as text for messages.
std::vector<std::pair<std::uint32_t, std::uint32_t>> param_layout(const KernelMetadata& m);
std::string layout_text(const std::vector<std::pair<std::uint32_t, std::uint32_t>>& v);

// Rules H1-H9 for an AMD code object's bytes (manifest_hsaco.cpp): the ELF structure and its
// NT_AMDGPU_METADATA note, SHA-256, the kernel by name and its "<name>.kd" symbol, the arch in
// e_flags, the explicit argument count and the wavefront size.
void check_hsaco_image(const KernelMetadata& m, const std::string& manifest_path, const std::string& place,
                       const std::vector<unsigned char>& image);

// Rules C2-C6 for a cubin's bytes (manifest_cubin.cpp).
void check_image(const KernelMetadata& m, const std::string& manifest_path, const std::string& place,
                 const std::vector<unsigned char>& image);

}  // namespace manifest_detail
}  // namespace luminav

// src/aot/manifest_cubin.cpp: a kernel variant's cubin, read on first use and checked against
// its manifest entry (rules C2-C6 of docs/bundle-format.md: the ELF rules, SHA-256, entry symbol,
// arch, .nv.info parameters and block size, the same as python/luminamoon/aot/manifest.py)
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "aot/bundle_file.h"
#include "aot/bundle_rules.h"
#include "aot/elf.h"
#include "aot/manifest.h"
#include "aot/manifest_internal.h"
#include "luminav/error.h"

namespace luminav {

using namespace manifest_detail;

namespace manifest_detail {

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

}  // namespace manifest_detail

namespace manifest_detail {

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

}  // namespace manifest_detail

void check_cubin_image(const KernelMetadata& m, const std::vector<unsigned char>& image) {
  const std::string manifest_path = m.cubin_state_ ? m.cubin_state_->manifest_path : std::string("manifest.json");
  const std::string place = m.cubin_state_ ? m.cubin_state_->place : "kernels[" + std::to_string(m.index) + "]";
  if (m.hip()) {
    check_hsaco_image(m, manifest_path, place, image);
  } else {
    check_image(m, manifest_path, place, image);
  }
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
    std::vector<unsigned char> bytes = read_bundle_file(c.dir, cubin, kCubinMaxBytes, c.prefix + "." + file_field());
    if (hip()) {
      check_hsaco_image(*this, c.manifest_path, c.place, bytes);
    } else {
      check_image(*this, c.manifest_path, c.place, bytes);
    }
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

}  // namespace luminav

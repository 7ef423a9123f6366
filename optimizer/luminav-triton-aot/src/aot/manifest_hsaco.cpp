// src/aot/manifest_hsaco.cpp: a HIP kernel variant's code object (hsaco) checked against its
// manifest entry by rules H1-H9 of docs/bundle-format.md (the same as python/luminamoon/aot/
// hsaco.py): the ELF and its NT_AMDGPU_METADATA note (aot/hsaco.h), SHA-256, the kernel and its
// descriptor symbol, the arch, the wavefront size, the explicit arguments and the block size
#include <cstdio>

#include "aot/bundle_rules.h"
#include "aot/hsaco.h"
#include "aot/manifest.h"
#include "aot/manifest_internal.h"

namespace luminav {
namespace manifest_detail {

void check_hsaco_image(const KernelMetadata& m, const std::string& manifest_path, const std::string& place,
                       const std::vector<unsigned char>& image) {
  const std::string prefix = "kernels[" + std::to_string(m.index) + "].";
  const std::string file =
      "hsaco \"" + printable(m.cubin_path, 4096) + "\" (" + std::to_string(image.size()) + " bytes)";
  auto fail = [&](BundleRule rule, const std::string& field, const std::string& expected, const std::string& found,
                  const std::string& text) {
    throw BundleError(rule, m.cubin_path, prefix + field, expected, found,
                      printable(manifest_path, 4096) + ": " + place + ": " + text + "; " + kFixRebuild);
  };
  if (image.empty()) fail(BundleRule::kTruncated, "hsaco", "a code object", "an empty file", file + " is empty: truncated");
  hsaco::HsacoInfo info;
  try {
    info = hsaco::parse_hsaco(image.data(), image.size());
  } catch (const elf::ElfError& e) {
    fail(e.rule(), "hsaco", "a whole, well-formed AMDGPU code object", printable(e.what()),
         file + ": " + printable(e.what()));
  }
  const std::string digest = sha256_hex(image.data(), image.size());
  if (digest != m.sha256) {
    fail(BundleRule::kSha256, "sha256", m.sha256, digest,
         "field \"sha256\": expected " + m.sha256 + " (as recorded), found " + digest + " for " + file +
             ": the code object was modified or the manifest belongs to another build");
  }
  // H5: one kernel of that name, and its descriptor symbol in .dynsym
  const std::vector<const hsaco::Kernel*> named = info.kernels_named(m.entry);
  const std::string kd = m.entry + ".kd";
  std::size_t descriptors = 0;
  for (const elf::Symbol& s : info.dynsym) {
    if (s.name == kd && s.bind == elf::kStbGlobal && s.type == elf::kSttObject && s.shndx > 0 && s.shndx < info.shnum) {
      ++descriptors;
    }
  }
  if (named.size() != 1 || named[0]->symbol.value_or(kd) != kd || descriptors != 1) {
    std::string names;
    for (const hsaco::Kernel& x : info.kernels) names += (names.empty() ? "\"" : ", \"") + printable(x.name) + "\"";
    const std::string found = "kernels [" + names + "]" +
                              (named.size() == 1 && named[0]->symbol.value_or(kd) != kd
                                   ? " (its .symbol \"" + printable(*named[0]->symbol) + "\")"
                                   : "") +
                              ", " + std::to_string(descriptors) + " such symbols";
    const std::string expected = "one kernel \"" + m.entry + "\" in the metadata note and one global object symbol \"" +
                                 kd + "\" in .dynsym";
    fail(BundleRule::kNoEntrySymbol, "entry", expected, found,
         "field \"entry\": expected " + expected + " (the kernel descriptor hipModuleGetFunction finds) in " + file +
             ", found " + found);
  }
  const hsaco::Kernel& k = *named[0];
  // H6: the arch
  if (info.mach != hsaco::arch_mach(m.gfx)) {
    char mach[8];
    std::snprintf(mach, sizeof mach, "0x%02x", info.mach);
    const std::string got = (info.arch.empty() ? std::string("an unknown arch") : info.arch) +
                            " (the code object's e_flags & 0xff = " + mach + ")";
    fail(BundleRule::kArch, "target.arch", got, m.gfx,
         "field \"target.arch\": expected " + got + ", the arch " + file + " was compiled for, found " + m.gfx);
  }
  // H7: the wavefront size
  if (!k.wavefront_size || *k.wavefront_size != static_cast<std::uint64_t>(m.warp_size)) {
    const std::string got = (k.wavefront_size ? std::to_string(*k.wavefront_size) : std::string("no")) +
                            " (the kernel's .wavefront_size)";
    fail(BundleRule::kWavefrontSize, "target.warp_size", got, std::to_string(m.warp_size),
         "field \"target.warp_size\": expected " + got + " in " + file + ", found " + std::to_string(m.warp_size));
  }
  // H8: the explicit arguments, count then layout
  const std::vector<hsaco::KernelArg> args = k.explicit_args();
  if (args.size() != static_cast<std::size_t>(m.num_params)) {
    fail(BundleRule::kParamMismatch, "num_params",
         std::to_string(args.size()) + " (the code object's explicit arguments of " + m.entry + ")",
         std::to_string(m.num_params),
         "field \"num_params\": expected " + std::to_string(args.size()) + " (the arguments of \"" + m.entry + "\" in " +
             file + " whose .value_kind is not hidden_*), found " + std::to_string(m.num_params) + " (len(signature) " +
             std::to_string(m.signature.size()) + " + num_trailing_scratch_ptrs " +
             std::to_string(m.num_trailing_scratch_ptrs) + ")");
  }
  std::vector<std::pair<std::uint32_t, std::uint32_t>> got;
  bool fits = true;
  for (const hsaco::KernelArg& a : args) {
    fits = fits && a.offset <= 0xffffffffu && a.size <= 0xffffffffu;
    got.emplace_back(static_cast<std::uint32_t>(a.offset), static_cast<std::uint32_t>(a.size));
  }
  const auto want = param_layout(m);
  if (!fits || got != want) {
    fail(BundleRule::kParamMismatch, "signature", "arguments (offset, size) " + layout_text(got) + " (the code object's)",
         layout_text(want) + " from the manifest",
         "field \"signature\": expected the arguments (offset, size) of \"" + m.entry + "\" in " + file + ", " +
             layout_text(got) + ", found " + layout_text(want) +
             " from the signature and the trailing scratch pointers: an ABI mismatch");
  }
  // H9: the block size
  const std::uint64_t threads = static_cast<std::uint64_t>(m.num_warps) * static_cast<std::uint64_t>(m.warp_size);
  if (k.max_flat_workgroup_size && *k.max_flat_workgroup_size < threads) {
    const std::string most = "at most " + std::to_string(*k.max_flat_workgroup_size) +
                             " threads (the kernel's .max_flat_workgroup_size)";
    fail(BundleRule::kLaunchShape, "num_warps", most, std::to_string(threads) + " (num_warps " + std::to_string(m.num_warps) + ")",
         "field \"num_warps\": expected " + most + " in " + file + ", found " + std::to_string(threads) +
             " threads (num_warps " + std::to_string(m.num_warps) + " x warp_size " + std::to_string(m.warp_size) + ")");
  }
}

}  // namespace manifest_detail
}  // namespace luminav

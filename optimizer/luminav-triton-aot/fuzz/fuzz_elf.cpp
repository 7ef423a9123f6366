// fuzz/fuzz_elf.cpp: libFuzzer over the cubin reader (elf::parse_cubin) and the cubin checks
// after it (check_cubin_image: entry symbol, arch, .nv.info parameters, block size)
//
// The input is a cubin for the first entry of the shared corpus's base manifest; its recorded
// hash is set to the input's, as a corrupted cubin whose sha256 was updated to match would be,
// so the checks after the hash are fuzzed too. Anything but acceptance or a BundleError (a
// crash, a sanitizer report, another exception) is a finding. Run by `make fuzz`.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "aot/bundle_rules.h"
#include "aot/elf.h"
#include "aot/manifest.h"

namespace {

const luminav::AotManifest& base() {
  static const auto m = std::make_unique<luminav::AotManifest>(luminav::AotManifest::load(LUMINAV_FUZZ_BUNDLE_DIR));
  return *m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<unsigned char> image(data, data + size);
  try {
    (void)luminav::elf::parse_cubin(image.data(), image.size());
  } catch (const luminav::elf::ElfError&) {
  }
  luminav::KernelMetadata entry = base().kernels()[0];
  entry.sha256 = luminav::sha256_hex(image.data(), image.size());
  try {
    luminav::check_cubin_image(entry, image);
  } catch (const luminav::BundleError&) {
    // refused: the contract
  } catch (const std::exception& e) {
    std::fprintf(stderr, "a cubin escaped as something other than a BundleError: %s\n", e.what());
    std::abort();
  }
  return 0;
}

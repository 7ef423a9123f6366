// fuzz/fuzz_hsaco.cpp: libFuzzer over the AMD code object reader (hsaco::parse_hsaco: the ELF
// walk and the msgpack metadata note) and the hsaco checks after it (check_cubin_image on a HIP
// entry: kernel and descriptor symbol, arch, wavefront size, explicit arguments, block size)
//
// The input is an hsaco for the first HIP entry of the shared corpus's base manifest; its
// recorded hash is set to the input's, as a corrupted code object whose sha256 was updated to
// match would be, so the checks after the hash are fuzzed too. Anything but acceptance or a
// BundleError (a crash, a sanitizer report, another exception) is a finding. Run by `make fuzz`.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <vector>

#include "aot/bundle_rules.h"
#include "aot/hsaco.h"
#include "aot/manifest.h"

namespace {

const luminav::KernelMetadata& hip_entry() {
  static const auto m = std::make_unique<luminav::AotManifest>(luminav::AotManifest::load(LUMINAV_FUZZ_BUNDLE_DIR));
  for (const luminav::KernelMetadata& k : m->kernels()) {
    if (k.hip()) return k;
  }
  std::fprintf(stderr, "%s/manifest.json has no HIP entry to fuzz against\n", LUMINAV_FUZZ_BUNDLE_DIR);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<unsigned char> image(data, data + size);
  try {
    (void)luminav::hsaco::parse_hsaco(image.data(), image.size());
  } catch (const luminav::elf::ElfError&) {
  }
  luminav::KernelMetadata entry = hip_entry();
  entry.sha256 = luminav::sha256_hex(image.data(), image.size());
  try {
    luminav::check_cubin_image(entry, image);
  } catch (const luminav::BundleError&) {
    // refused: the contract
  } catch (const std::exception& e) {
    std::fprintf(stderr, "an hsaco escaped as something other than a BundleError: %s\n", e.what());
    std::abort();
  }
  return 0;
}

// fuzz/fuzz_manifest.cpp: libFuzzer over the manifest reader (AotManifest::parse: the JSON
// profile, the top level and every kernel entry, then a stat of each cubin it names)
//
// Any input must either load or be refused with a BundleError; anything else escaping, a
// crash, a sanitizer report, a hang or unbounded memory is a finding. The cubins a manifest names
// are looked up in the shared corpus's base/ (LUMINAV_FUZZ_BUNDLE_DIR), so a mutation of the
// real manifest reaches the file checks too. Run by `make fuzz`.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "aot/bundle_rules.h"
#include "aot/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const luminav::AotManifest m =
        luminav::AotManifest::parse(text, LUMINAV_FUZZ_BUNDLE_DIR, "manifest.json", luminav::CubinCheck::kOnFirstUse);
    (void)m.keys();
  } catch (const luminav::BundleError&) {
    // refused: the contract
  } catch (const std::exception& e) {
    std::fprintf(stderr, "a manifest escaped as something other than a BundleError: %s\n", e.what());
    std::abort();
  }
  return 0;
}

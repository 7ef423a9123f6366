// src/aot/manifest.h: a bundle's manifest.json, its kernel variants and their cubins (read and
// checked on first use), found by variant key and device arch
//
// A bundle is a folder: manifest.json + one .cubin per compiled kernel variant and arch (the
// format and its rule book are in docs/bundle-format.md; the Python builder luminamoon.aot
// writes it, and python/luminamoon/aot/manifest.py reads it by the same rules). Every refusal
// is a BundleError (aot/bundle_rules.h) with the rule book's reason code. The runtime that loads
// and launches the cubins is aot/runtime.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "aot/triton_abi.h"

namespace luminav {

constexpr const char* kAotBundleFormat = "luminamoon-aot-bundle";
constexpr int kAotBundleFormatVersion = 3;  // the newest format_version this loader reads (3: HIP entries)
// Columns of the device tables the kernels of a format_version 1 bundle read (version 2
// manifests say it in "table_cols").
constexpr int kAotBundleV1TableCols = 12;

// SHA-256 (OpenSSL EVP) as 64 lowercase hex digits.
std::string sha256_hex(const void* data, std::size_t size);

// One compiled kernel variant for one arch: an entry of manifest.json, and its cubin (read and
// verified on first use).
struct KernelMetadata {
  std::size_t index = 0;  // position in the manifest's kernels array
  std::string key;     // variant key, arch-independent (docs/internals.md), as derived from
                       // kernel, constexprs and num_warps (derive_variant_key)
  std::string kernel;  // pass1 | reduce | pass2 | single_pass | commit
  std::string name;    // the Triton function's name
  std::string entry;   // the .entry symbol in the cubin; for HIP the kernel's name (symbol "<entry>.kd")
  std::string cubin;   // the code object's file name relative to the bundle folder: the manifest's
                       // "cubin" for CUDA, its "hsaco" for HIP
  std::string sha256;  // of the code object, 64 lowercase hex digits
  std::string backend = "cuda";  // "cuda" or "hip"
  int arch = 0;        // CUDA: e.g. 90 for sm_90, 100 for sm_100; HIP: the e_flags machine byte (0x4c)
  std::string gfx;     // HIP: the arch name, "gfx90a", "gfx942" or "gfx950"; "" for CUDA
  int warp_size = 32;  // 32 (CUDA), 64 (HIP)
  std::string triton_version;
  int num_warps = 0;
  int num_ctas = 1;
  int num_stages = 0;
  std::int64_t shared_mem = 0;  // bytes of dynamic shared memory
  std::vector<std::string> arg_names;
  std::vector<std::string> signature;
  std::vector<ArgType> arg_types;  // parsed from signature, same order
  std::map<std::string, std::int64_t> constexprs;  // integers, each a name the key encodes
  int num_params = 0;  // .param entries of the .entry = signature.size() + trailing
  int num_trailing_scratch_ptrs = 0;
  std::int64_t global_scratch_size = 0;
  std::int64_t global_scratch_align = 1;
  std::int64_t profile_scratch_size = 0;
  std::int64_t profile_scratch_align = 1;

  std::string cubin_path;         // absolute or as given: bundle dir / cubin
  std::uint64_t cubin_bytes = 0;  // the cubin file's size when the manifest was loaded

  // The cubin's bytes, read and checked on the first call by the rule book (a regular file
  // inside the bundle of at most kCubinMaxBytes; a well-formed CUDA ELF image, aot/elf.h;
  // SHA-256 `sha256`; the entry symbol; the arch in e_flags; the .nv.info parameter list and
  // block size against signature, trailing scratch pointers and num_warps). Later calls return
  // the same bytes without reading the file again. Thread-safe. Throws BundleError naming the
  // manifest, the entry, the cubin file, expected and found, and the fix; a failed check is not
  // remembered, so a later call reads the file again. The reference stays valid as long as this
  // metadata (or a copy of it) lives.
  const std::vector<unsigned char>& image() const;
  // True once image() has read and verified the cubin.
  bool image_verified() const noexcept;

  bool hip() const { return backend == "hip"; }
  // "sm_90" or "gfx942": the arch as messages name it.
  std::string arch_label() const { return hip() ? gfx : "sm_" + std::to_string(arch); }
  // The manifest field that names the code object: "cubin" or "hsaco".
  const char* file_field() const { return hip() ? "hsaco" : "cubin"; }

  int arch_major() const { return arch / 10; }
  int arch_minor() const { return arch % 10; }
  // True when a device of compute capability major.minor can run this cubin: same major, and
  // a minor at least the cubin's.
  bool runs_on(int device_major, int device_minor) const {
    return !hip() && device_major == arch_major() && device_minor >= arch_minor();
  }
  int block_threads() const { return num_warps * warp_size; }
  // Bytes of global (or profile) scratch a launch of this grid needs: grid_x·grid_y·grid_z·
  // num_ctas·size; 0 when the size is 0. Throws Error(kInvalidArgument) on overflow.
  std::size_t global_scratch_bytes(unsigned grid_x, unsigned grid_y, unsigned grid_z) const;
  std::size_t profile_scratch_bytes(unsigned grid_x, unsigned grid_y, unsigned grid_z) const;

 private:
  friend class AotManifest;
  friend void check_cubin_image(const KernelMetadata& m, const std::vector<unsigned char>& image);
  struct Cubin;                  // the lazily read image, shared by copies of this metadata
  std::shared_ptr<Cubin> cubin_state_;
};

// When AotManifest::load reads and checks the cubins a manifest names.
enum class CubinCheck {
  kOnFirstUse,  // when each kernel is first loaded (KernelMetadata::image): a step reads only the
                // few cubins it runs, not the whole bundle
  kNow,         // every cubin at load, as `luminav verify` does
};

// A bundle's manifest. Loading applies the rule book of docs/bundle-format.md in its order and
// refuses with a BundleError (reason code, file, field, expected, found): the file (F), its
// JSON profile (J), the top level (T) and each kernel entry (K), then each cubin file (C1: one
// stat each). A cubin's content is checked when it is first read (KernelMetadata::image: by
// AotRuntime before the kernel's first launch, or by verify_cubins), or at load with
// CubinCheck::kNow; either way a bad cubin is refused with the same code before it reaches the
// driver.
// The variant key of `kernel` with these constexprs and warps (docs/internals.md "Variant
// keys"): the kernel, the dtype codes present (p, g, s) joined, then sr, b, c, f, n, B, R, T for
// the constexprs present, then w<num_warps>; e.g. "pass2.p1g1s0.sr1.b2.c1.f1.B1024.w4".
std::string derive_variant_key(const std::string& kernel, const std::map<std::string, std::int64_t>& constexprs,
                               int num_warps);

// Rules C2-C6 on a cubin's bytes for the entry `m` (a KernelMetadata of a loaded manifest): the
// ELF structure, SHA-256, entry symbol, arch, parameters and block size. Throws BundleError.
// KernelMetadata::image runs it on the file; the fuzz target runs it on any bytes.
void check_cubin_image(const KernelMetadata& m, const std::vector<unsigned char>& image);

class AotManifest {
 public:
  AotManifest() = default;
  // Reads <dir>/manifest.json; each cubin it names must exist and be non-empty (one stat each).
  // With CubinCheck::kNow every cubin is also read and verified (verify_cubins).
  static AotManifest load(const std::string& dir, CubinCheck cubins = CubinCheck::kOnFirstUse);
  // Parses manifest text; cubin files are found relative to `dir`. `manifest_path` only names
  // the file in messages. With CubinCheck::kNow each cubin is read and checked in manifest
  // order (the first refusal is the one Python's load_bundle reports).
  static AotManifest parse(const std::string& json_text, const std::string& dir, const std::string& manifest_path,
                           CubinCheck cubins = CubinCheck::kOnFirstUse);

  // Reads and verifies every cubin (KernelMetadata::image), in manifest order; throws the first
  // refusal. Cubins already verified are not read again.
  void verify_cubins() const;

  const std::string& dir() const { return dir_; }
  const std::string& manifest_path() const { return manifest_path_; }
  int format_version() const { return format_version_; }
  // Columns of the int64 device table the bundle's kernels read (docs/internals.md).
  int table_cols() const { return table_cols_; }
  const std::string& created_by() const { return created_by_; }
  const std::string& triton_version() const { return triton_version_; }
  const std::vector<KernelMetadata>& kernels() const { return kernels_; }
  bool empty() const { return kernels_.empty(); }

  // The variant of `key` for a device of compute capability arch_major.arch_minor: the entry of
  // the same major with the highest minor <= arch_minor. Null when none.
  const KernelMetadata* find(const std::string& key, int arch_major, int arch_minor) const noexcept;
  // As find, but throws Error(kNotFound) listing the archs the bundle has for the key (or that
  // it has no such key) and the fix: `luminamoon aot build --arch <major><minor>`.
  const KernelMetadata& require(const std::string& key, int arch_major, int arch_minor) const;
  // The HIP variant of `key` for a device of that arch name ("gfx942"; Triton's code objects run
  // only on the arch they were compiled for). Null when none.
  const KernelMetadata* find_hip(const std::string& key, const std::string& gfx) const noexcept;
  // As find_hip, but throws Error(kNotFound) naming the archs the bundle has for the key and the
  // fix: `luminamoon aot build --arch <gfx>`.
  const KernelMetadata& require_hip(const std::string& key, const std::string& gfx) const;
  // The archs (e.g. 80, 90) the bundle has for `key`, ascending (CUDA entries only).
  std::vector<int> archs_for(const std::string& key) const;
  // Every distinct variant key, sorted.
  std::vector<std::string> keys() const;

 private:
  std::string dir_;
  std::string manifest_path_;
  int format_version_ = 0;
  int table_cols_ = 0;
  std::string created_by_;
  std::string triton_version_;
  std::vector<KernelMetadata> kernels_;
};

}  // namespace luminav

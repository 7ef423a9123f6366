// tests/fakes/fake_bundle.h: bundles written by the tests themselves: a temporary folder, minimal
// but well-formed ELF64 "cubins", manifest entries for the kernels of docs/internals.md
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace luminav_test {

using nlohmann::json;

// A minimal ELF64 little-endian image: header, one PROGBITS section holding `payload`, and the
// section header table (null + that section) at the end.
std::vector<unsigned char> make_fake_cubin(const std::string& payload);

// A temporary folder removed at scope end.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes);
std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);

// The pass-2 kernel's user arguments (docs/internals.md), in order.
std::vector<std::string> pass2_arg_names();
std::vector<std::string> pass2_signature();

// A kernel of docs/internals.md: its kind, Triton name (also the cubin's .entry) and user
// arguments (names and type words).
struct KernelSpec {
  std::string kernel, name;
  std::vector<std::string> arg_names, signature;
};
// The spec of "pass1", "reduce", "single_pass", "commit"; anything else gives pass 2's.
KernelSpec kernel_spec(const std::string& kernel);

// Writes a cubin into `dir` and returns a manifest entry for it (Triton 3.5+ ABI: 2 trailing
// scratch pointers), for the kernel `spec` (pass 2 unless given).
json add_variant(const TempDir& dir, const std::string& key, int arch, const std::string& payload = "",
                 const KernelSpec& spec = kernel_spec("pass2"));

// A format_version 2 manifest holding `kernels`, with 18-column tables (the engine's).
json manifest_with(const std::vector<json>& kernels);
void write_manifest(const TempDir& dir, const json& manifest);

constexpr const char* kPass2Key = "pass2.p1g1s0.sr1.b2.c1.f1.B2048.w8";

}  // namespace luminav_test

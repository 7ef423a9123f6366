// tests/fakes/fake_bundle.cpp: bundles written by the tests themselves (see fake_bundle.h)
#include "fakes/fake_bundle.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>

#include "aot/manifest.h"

namespace luminav_test {

// A minimal ELF64 little-endian image: header, one PROGBITS section holding `payload`, and the
// section header table (null + that section) at the end.
std::vector<unsigned char> make_fake_cubin(const std::string& payload) {
  const std::size_t shoff = 64 + payload.size();
  std::vector<unsigned char> b(shoff + 128, 0);  // header, payload, 2 section headers
  auto put = [&b](std::size_t off, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b[off + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
  };
  b[0] = 0x7f;
  b[1] = 'E';
  b[2] = 'L';
  b[3] = 'F';
  b[4] = 2;  // ELFCLASS64
  b[5] = 1;  // little-endian
  b[6] = 1;  // EV_CURRENT
  put(0x10, 2, 2);      // ET_EXEC
  put(0x12, 190, 2);    // EM_CUDA
  put(0x28, shoff, 8);  // e_shoff
  put(0x34, 64, 2);     // e_ehsize
  put(0x3A, 64, 2);     // e_shentsize
  put(0x3C, 2, 2);      // e_shnum
  for (std::size_t i = 0; i < payload.size(); ++i) b[64 + i] = static_cast<unsigned char>(payload[i]);
  const std::size_t sh1 = shoff + 64;  // section 0 is the null section
  put(sh1 + 4, 1, 4);                  // sh_type PROGBITS
  put(sh1 + 0x18, 64, 8);              // sh_offset
  put(sh1 + 0x20, payload.size(), 8);  // sh_size
  return b;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "luminav-aot-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// The pass-2 kernel's user arguments (docs/internals.md), in order.
std::vector<std::string> pass2_arg_names() {
  return {"table", "block_map", "stats", "found_inf", "lr", "seed", "sign", "beta1", "beta2", "eps",
          "weight_decay", "clip", "bound"};
}
std::vector<std::string> pass2_signature() {
  return {"*i64", "*i32", "*fp32", "*i32", "*fp32", "i64", "fp32", "fp32", "fp32", "fp32", "fp32", "fp32", "fp32"};
}

KernelSpec kernel_spec(const std::string& kernel) {
  if (kernel == "pass1") {
    return {kernel, "_lumina_tdclm_pass1_kernel",
            {"table", "block_map", "partial_sum", "partial_bad", "seed", "sign", "beta1", "beta2", "eps"},
            {"*i64", "*i32", "*fp32", "*i32", "i64", "fp32", "fp32", "fp32", "fp32"}};
  }
  if (kernel == "reduce") {
    return {kernel, "_lumina_tdclm_reduce_kernel",
            {"table", "partial_sum", "partial_bad", "stats", "found_inf", "ntensors"},
            {"*i64", "*fp32", "*i32", "*fp32", "*i32", "i32"}};
  }
  if (kernel == "single_pass") return {kernel, "_lumina_adamw_single_pass_kernel", pass2_arg_names(), pass2_signature()};
  if (kernel == "commit") {
    return {kernel, "_lumina_tdclm_commit_kernel", {"table", "found_inf", "ntensors"}, {"*i64", "*i32", "i32"}};
  }
  return {"pass2", "_lumina_tdclm_pass2_kernel", pass2_arg_names(), pass2_signature()};
}

// Writes a cubin into `dir` and returns a manifest entry for it (Triton 3.5+ ABI: 2 trailing
// scratch pointers), for the kernel `spec` (pass 2 unless given).
json add_variant(const TempDir& dir, const std::string& key, int arch, const std::string& payload,
                 const KernelSpec& spec) {
  const std::string cubin_name = key + ".sm" + std::to_string(arch) + ".cubin";
  const auto bytes = make_fake_cubin(payload.empty() ? "cubin of " + cubin_name : payload);
  write_bytes(dir.file(cubin_name), bytes);
  const auto& names = spec.arg_names;
  const auto& sig = spec.signature;
  json e = {
      {"key", key},
      {"kernel", spec.kernel},
      {"name", spec.name},
      {"entry", spec.name},
      {"cubin", cubin_name},
      {"sha256", luminav::sha256_hex(bytes.data(), bytes.size())},
      {"target", {{"backend", "cuda"}, {"arch", arch}, {"warp_size", 32}}},
      {"triton_version", "3.6.0"},
      {"num_warps", 8},
      {"num_ctas", 1},
      {"num_stages", 3},
      {"shared_mem", 0},
      {"arg_names", names},
      {"signature", sig},
      {"constexprs", {{"P_DTYPE", 1}, {"G_DTYPE", 1}, {"S_DTYPE", 0}, {"SR", 1}, {"BOUND_MODE", 2},
                      {"USE_CLIP", 1}, {"CHECK_FLAG", 1}, {"BLOCK", 2048}}},
      {"num_params", static_cast<int>(sig.size()) + 2},
      {"num_trailing_scratch_ptrs", 2},
      {"global_scratch_size", 0},
      {"global_scratch_align", 1},
      {"profile_scratch_size", 0},
      {"profile_scratch_align", 1},
  };
  return e;
}

json manifest_with(const std::vector<json>& kernels) {
  return json{{"format", "luminamoon-aot-bundle"},
              {"format_version", 2},
              {"table_cols", 18},  // the engine's (engine/group_launch.h kTableCols)
              {"created_by", "luminamoon 0.1.0"},
              {"triton_version", "3.6.0"},
              {"kernels", kernels}};
}

void write_manifest(const TempDir& dir, const json& manifest) {
  write_text(dir.file("manifest.json"), manifest.dump(2));
}

}  // namespace luminav_test

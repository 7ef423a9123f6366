// tests/fakes/fake_hsaco.cpp: minimal AMD code objects for the tests (fake_hsaco.h)
#include "fakes/fake_hsaco.h"

#include <cstring>

#include <msgpack.hpp>

#include "aot/hsaco.h"
#include "aot/manifest.h"
#include "aot/triton_abi.h"

namespace luminav_test {

namespace {

void put(std::vector<unsigned char>& out, std::size_t at, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out[at + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
}

void pad4(std::string& s) {
  while (s.size() % 4) s.push_back('\0');
}

std::string pack_metadata(const FakeHsaco& spec) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(3);
  pk.pack(std::string("amdhsa.kernels"));
  pk.pack_array(1);
  pk.pack_map(4 + (spec.wavefront_size > 0 ? 1 : 0) + (spec.max_flat_workgroup_size > 0 ? 1 : 0));
  pk.pack(std::string(".name"));
  pk.pack(spec.name);
  pk.pack(std::string(".symbol"));
  pk.pack(spec.symbol.empty() ? spec.name + ".kd" : spec.symbol);
  pk.pack(std::string(".kernarg_segment_size"));
  std::uint64_t off = 0;
  for (const auto& a : spec.args) off = (off + a.size - 1) / a.size * a.size + a.size;
  pk.pack(off);
  if (spec.wavefront_size > 0) {
    pk.pack(std::string(".wavefront_size"));
    pk.pack(spec.wavefront_size);
  }
  if (spec.max_flat_workgroup_size > 0) {
    pk.pack(std::string(".max_flat_workgroup_size"));
    pk.pack(spec.max_flat_workgroup_size);
  }
  pk.pack(std::string(".args"));
  pk.pack_array(static_cast<std::uint32_t>(spec.args.size()));
  off = 0;
  for (const auto& a : spec.args) {
    off = (off + a.size - 1) / a.size * a.size;
    pk.pack_map(3);
    pk.pack(std::string(".offset"));
    pk.pack(off);
    pk.pack(std::string(".size"));
    pk.pack(a.size);
    pk.pack(std::string(".value_kind"));
    pk.pack(a.value_kind);
    off += a.size;
  }
  pk.pack(std::string("amdhsa.target"));
  pk.pack(std::string("amdgcn-amd-amdhsa--") + luminav::hsaco::arch_name(spec.mach));
  pk.pack(std::string("amdhsa.version"));
  pk.pack_array(2);
  pk.pack(1);
  pk.pack(2);
  return std::string(buf.data(), buf.size());
}

}  // namespace

std::vector<unsigned char> make_fake_hsaco(const FakeHsaco& spec) {
  // the note: namesz, descsz, type, "AMDGPU\0" padded, descriptor padded
  std::string note;
  if (spec.note) {
    const std::string desc = spec.metadata.empty() ? pack_metadata(spec) : spec.metadata;
    std::string rec(12, '\0');
    std::vector<unsigned char> h(12);
    put(h, 0, 7, 4);
    put(h, 4, desc.size(), 4);
    put(h, 8, luminav::hsaco::kNtAmdgpuMetadata, 4);
    rec.assign(h.begin(), h.end());
    rec += std::string("AMDGPU", 7);
    pad4(rec);
    rec += desc;
    pad4(rec);
    note = rec;
  }
  std::string dynstr(1, '\0');
  std::vector<std::pair<std::string, std::uint32_t>> syms = {{spec.name, 0}};
  if (spec.descriptor_symbol) syms.emplace_back(spec.name + ".kd", 0);
  for (auto& s : syms) {
    s.second = static_cast<std::uint32_t>(dynstr.size());
    dynstr += s.first + '\0';
  }
  std::vector<unsigned char> dynsym((syms.size() + 1) * 24, 0);
  for (std::size_t i = 0; i < syms.size(); ++i) {
    put(dynsym, (i + 1) * 24, syms[i].second, 4);
    dynsym[(i + 1) * 24 + 4] = i == 0 ? 0x12 : 0x11;  // GLOBAL FUNC / GLOBAL OBJECT
    put(dynsym, (i + 1) * 24 + 6, i == 0 ? 4 : 4, 2);
  }
  const std::string shstrtab = std::string("\0.note\0.dynsym\0.dynstr\0.text\0.shstrtab\0", 39);
  // layout
  std::vector<unsigned char> out(64, 0);
  auto append = [&](const void* p, std::size_t n) {
    while (out.size() % 8) out.push_back(0);
    const std::size_t at = out.size();
    out.resize(at + n);
    if (n > 0) std::memcpy(out.data() + at, p, n);
    return at;
  };
  const std::size_t note_at = append(note.data(), note.size());
  const std::size_t dynsym_at = append(dynsym.data(), dynsym.size());
  const std::size_t dynstr_at = append(dynstr.data(), dynstr.size());
  const std::size_t text_at = append(spec.payload.data(), spec.payload.size());
  const std::size_t shstr_at = append(shstrtab.data(), shstrtab.size());
  while (out.size() % 8) out.push_back(0);
  const std::size_t shoff = out.size();
  out.resize(shoff + 6 * 64, 0);
  struct S {
    std::uint32_t name, type;
    std::uint64_t flags, offset, size;
    std::uint32_t link;
    std::uint64_t entsize;
  };
  const S secs[6] = {{0, 0, 0, 0, 0, 0, 0},
                     {1, 7, 2, note_at, note.size(), 0, 0},
                     {7, 11, 2, dynsym_at, dynsym.size(), 3, 24},
                     {15, 3, 2, dynstr_at, dynstr.size(), 0, 0},
                     {23, 1, 6, text_at, spec.payload.size(), 0, 0},
                     {29, 3, 0, shstr_at, shstrtab.size(), 0, 0}};
  for (int i = 0; i < 6; ++i) {
    const std::size_t at = shoff + static_cast<std::size_t>(i) * 64;
    put(out, at, secs[i].name, 4);
    put(out, at + 4, secs[i].type, 4);
    put(out, at + 8, secs[i].flags, 8);
    put(out, at + 24, secs[i].offset, 8);
    put(out, at + 32, secs[i].size, 8);
    put(out, at + 40, secs[i].link, 4);
    put(out, at + 44, i == 2 ? 1 : 0, 4);
    put(out, at + 56, secs[i].entsize, 8);
  }
  const unsigned char ident[16] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 64, 3};
  std::copy(ident, ident + 16, out.begin());
  put(out, 16, 3, 2);    // ET_DYN
  put(out, 18, 224, 2);  // EM_AMDGPU
  put(out, 20, 1, 4);
  put(out, 40, shoff, 8);
  put(out, 48, 0x500u | spec.mach, 4);
  put(out, 52, 64, 2);
  put(out, 58, 64, 2);
  put(out, 60, 6, 2);
  put(out, 62, 5, 2);
  return out;
}

std::vector<FakeHsacoArg> hsaco_args(const std::vector<std::string>& signature, int trailing, int hidden) {
  std::vector<FakeHsacoArg> out;
  for (const std::string& w : signature) {
    const luminav::ArgType t = luminav::ArgType::parse(w);
    out.push_back({t.pointer ? "global_buffer" : "by_value", t.size});
  }
  for (int i = 0; i < trailing; ++i) out.push_back({"global_buffer", 8});
  const char* kinds[] = {"hidden_block_count_x", "hidden_block_count_y", "hidden_block_count_z"};
  for (int i = 0; i < hidden; ++i) out.push_back({kinds[i % 3], 4});
  return out;
}

json add_hip_variant(const TempDir& dir, const std::string& key, const std::string& gfx, const VariantOptions& options) {
  const KeyParts parts = parse_key(key);
  const KernelSpec spec = options.spec.kernel.empty() ? kernel_spec(parts.kernel) : options.spec;
  const std::string file = key + "." + gfx + ".hsaco";
  FakeHsaco h;
  h.name = spec.name;
  h.mach = luminav::hsaco::arch_mach(gfx);
  h.args = hsaco_args(spec.signature, options.trailing, 2);
  h.payload = options.payload.empty() ? "hsaco of " + file : options.payload;
  const auto bytes = make_fake_hsaco(h);
  write_bytes(dir.file(file), bytes);
  return json{
      {"key", key},
      {"kernel", spec.kernel},
      {"name", spec.name},
      {"entry", spec.name},
      {"hsaco", file},
      {"sha256", luminav::sha256_hex(bytes.data(), bytes.size())},
      {"target", {{"backend", "hip"}, {"arch", gfx}, {"warp_size", 64}}},
      {"triton_version", options.triton_version},
      {"num_warps", parts.num_warps},
      {"num_ctas", 1},
      {"num_stages", 2},
      {"shared_mem", 512},
      {"arg_names", spec.arg_names},
      {"signature", spec.signature},
      {"constexprs", parts.constexprs},
      {"num_params", static_cast<int>(spec.signature.size()) + options.trailing},
      {"num_trailing_scratch_ptrs", options.trailing},
      {"global_scratch_size", 0},
      {"global_scratch_align", 1},
      {"profile_scratch_size", 0},
      {"profile_scratch_align", 1},
  };
}

json manifest_v3_with(const std::vector<json>& kernels) {
  json m = manifest_with(kernels);
  m["format_version"] = 3;
  return m;
}

}  // namespace luminav_test

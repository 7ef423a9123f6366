// tests/fakes/fake_bundle.cpp: bundles written by the tests themselves (see fake_bundle.h)
#include "fakes/fake_bundle.h"

#include <stdlib.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>

#include "aot/manifest.h"
#include "aot/triton_abi.h"

namespace luminav_test {

namespace {

void put(std::vector<unsigned char>& b, std::size_t off, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[off + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
}

void append(std::vector<unsigned char>& b, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

struct Shdr {
  std::uint32_t name = 0, type = 0;
  std::uint64_t flags = 0, offset = 0, size = 0;
  std::uint32_t link = 0, info = 0;
  std::uint64_t align = 1, entsize = 0;
};

}  // namespace

std::vector<unsigned char> make_fake_cubin(const FakeCubin& spec) {
  const bool kernel = !spec.entry.empty();
  const std::string payload = spec.payload.empty() ? std::string("text") : spec.payload;
  // Section names and the symbol names.
  std::string shstr(1, '\0');
  auto add_name = [](std::string& table, const std::string& name) {
    const auto off = static_cast<std::uint32_t>(table.size());
    table += name;
    table.push_back('\0');
    return off;
  };
  std::vector<unsigned char> b(64, 0);  // the ELF header, filled in last
  std::vector<Shdr> sh(1);              // section 0: null
  auto place = [&](Shdr h, const std::vector<unsigned char>& data) {
    h.offset = b.size();
    h.size = data.size();
    b.insert(b.end(), data.begin(), data.end());
    sh.push_back(h);
    return static_cast<std::uint32_t>(sh.size() - 1);
  };
  auto bytes_of = [](const std::string& s) { return std::vector<unsigned char>(s.begin(), s.end()); };
  Shdr shstrtab;
  shstrtab.type = 3;
  shstrtab.name = add_name(shstr, ".shstrtab");
  if (!kernel) {
    // [1] .text [2] .shstrtab
    Shdr text;
    text.type = 1;
    text.name = add_name(shstr, ".text");
    place(text, bytes_of(payload));
    place(shstrtab, bytes_of(shstr));
  } else {
    // [1] .shstrtab [2] .strtab [3] .symtab [4] .nv.info.<entry> [5] .text.<entry>
    // [6] .nv.constant0.<entry> (the parameter bank) [7] .nv.info (module-wide)
    std::string strtab(1, '\0');
    const std::uint32_t entry_name = add_name(strtab, spec.entry);
    Shdr s_strtab, s_symtab, s_info, s_text;
    s_strtab.type = 3;
    s_strtab.name = add_name(shstr, ".strtab");
    s_symtab.type = 2;
    s_symtab.name = add_name(shstr, ".symtab");
    s_symtab.link = 2;
    s_symtab.info = 1;  // symbol 1 is the first global one
    s_symtab.align = 8;
    s_symtab.entsize = 24;
    s_info.type = 0x70000000;  // .nv.info
    s_info.name = add_name(shstr, ".nv.info." + spec.entry);
    s_info.flags = 0x40;  // SHF_INFO_LINK: sh_info is the code section
    s_info.link = 3;
    s_info.info = 5;
    s_info.align = 4;
    s_text.type = 1;
    s_text.name = add_name(shstr, ".text." + spec.entry);
    s_text.flags = 0x6;  // alloc, exec
    s_text.link = 3;
    s_text.info = 1;  // the function's symbol
    s_text.align = 4;
    place(shstrtab, {});  // the name table's bytes are written below, once complete
    place(s_strtab, bytes_of(strtab));
    std::vector<unsigned char> syms(24, 0);  // symbol 0: null
    append(syms, entry_name, 4);
    syms.push_back(0x12);  // STB_GLOBAL, STT_FUNC
    syms.push_back(0x10);  // the CUDA entry mark
    append(syms, 5, 2);    // in .text.<entry>
    append(syms, 0, 8);
    append(syms, payload.size(), 8);
    append(syms, 0, 4);    // symbol 2: the section symbol of .nv.constant0.<entry>
    syms.push_back(0x03);  // STB_LOCAL, STT_SECTION
    syms.push_back(0);
    append(syms, 6, 2);
    append(syms, 0, 8);
    append(syms, 0, 8);
    place(s_symtab, syms);
    std::vector<unsigned char> info;
    std::uint64_t off = 0;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> layout;
    for (std::uint32_t size : spec.param_sizes) {
      off = (off + size - 1) / size * size;
      layout.emplace_back(off, size);
      off += size;
    }
    for (std::size_t i = layout.size(); i-- > 0;) {  // ptxas writes the last ordinal first
      info.push_back(4);     // EIFMT_SVAL
      info.push_back(0x17);  // EIATTR_KPARAM_INFO
      append(info, 12, 2);
      append(info, 0, 4);  // index
      append(info, i, 2);  // ordinal
      append(info, layout[i].first, 2);
      append(info, (std::uint64_t{layout[i].second} << 18) | 0x1f000, 4);
    }
    info.push_back(3);     // EIFMT_HVAL
    info.push_back(0x19);  // EIATTR_CBANK_PARAM_SIZE
    append(info, off, 2);
    if (spec.threads > 0) {
      info.push_back(4);
      info.push_back(0x10);  // EIATTR_REQNTID
      append(info, 12, 2);
      append(info, spec.threads, 4);
      append(info, 1, 4);
      append(info, 1, 4);
    }
    info.push_back(4);     // EIFMT_SVAL
    info.push_back(0x0a);  // EIATTR_PARAM_CBANK: symbol 2, offset 0, the parameters' size
    append(info, 8, 2);
    append(info, 2, 4);
    append(info, off << 16, 4);
    place(s_info, info);
    place(s_text, bytes_of(payload));
    Shdr s_bank, s_module;
    s_bank.type = 1;
    s_bank.name = add_name(shstr, ".nv.constant0." + spec.entry);
    s_bank.flags = 0x2;  // alloc
    s_bank.align = 4;
    place(s_bank, std::vector<unsigned char>(off, 0));
    s_module.type = 0x70000000;  // .nv.info, module-wide: FRAME_SIZE, MIN_STACK_SIZE, REGCOUNT
    s_module.name = add_name(shstr, ".nv.info");
    s_module.link = 3;
    s_module.align = 4;
    std::vector<unsigned char> module;
    for (const std::uint32_t attr : {0x11u, 0x12u, 0x2fu}) {
      module.push_back(4);
      module.push_back(static_cast<unsigned char>(attr));
      append(module, 8, 2);
      append(module, 1, 4);  // the entry
      append(module, attr == 0x2f ? 16 : 0, 4);
    }
    place(s_module, module);
    // Now the name table is complete: append it and point section 1 at it.
    sh[1].offset = b.size();
    sh[1].size = shstr.size();
    b.insert(b.end(), shstr.begin(), shstr.end());
  }
  const std::uint64_t shoff = b.size();
  const std::uint32_t shstrndx = kernel ? 1 : 2;
  for (const Shdr& h : sh) {
    append(b, h.name, 4);
    append(b, h.type, 4);
    append(b, h.flags, 8);
    append(b, 0, 8);  // sh_addr
    append(b, h.offset, 8);
    append(b, h.size, 8);
    append(b, h.link, 4);
    append(b, h.info, 4);
    append(b, h.type == 0 ? 0 : h.align, 8);
    append(b, h.entsize, 8);
  }
  b[0] = 0x7f;
  b[1] = 'E';
  b[2] = 'L';
  b[3] = 'F';
  b[4] = 2;     // ELFCLASS64
  b[5] = 1;     // little-endian
  b[6] = 1;     // EV_CURRENT
  b[7] = 0x33;  // the CUDA OS/ABI
  b[8] = 7;     // ELF ABI version 7: the SM arch in the low byte of e_flags
  put(b, 0x10, 2, 2);        // ET_EXEC
  put(b, 0x12, 190, 2);      // EM_CUDA
  put(b, 0x14, 0x80, 4);     // e_version: the CUDA version, as ptxas writes it
  put(b, 0x28, shoff, 8);    // e_shoff
  put(b, 0x30, (static_cast<std::uint64_t>(spec.arch) << 16) | static_cast<std::uint64_t>(spec.arch), 4);
  put(b, 0x34, 64, 2);       // e_ehsize
  put(b, 0x3A, 64, 2);       // e_shentsize
  put(b, 0x3C, sh.size(), 2);
  put(b, 0x3E, shstrndx, 2);
  return b;
}

std::vector<unsigned char> make_fake_cubin(const std::string& payload) {
  FakeCubin spec;
  spec.payload = payload;
  return make_fake_cubin(spec);
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

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
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

KeyParts parse_key(const std::string& key) {
  KeyParts out;
  std::size_t start = 0;
  std::vector<std::string> parts;
  for (std::size_t i = 0; i <= key.size(); ++i) {
    if (i == key.size() || key[i] == '.') {
      parts.push_back(key.substr(start, i - start));
      start = i + 1;
    }
  }
  out.kernel = parts.empty() ? key : parts[0];
  auto number = [](const std::string& s) { return s.empty() ? 0 : std::stoll(s); };
  const std::pair<const char*, const char*> letters[] = {{"sr", "SR"},       {"b", "BOUND_MODE"}, {"c", "USE_CLIP"},
                                                         {"f", "CHECK_FLAG"}, {"n", "NEED_SUM"},   {"B", "BLOCK"},
                                                         {"R", "RBLOCK"},     {"T", "TBLOCK"}};
  for (std::size_t p = 1; p < parts.size(); ++p) {
    const std::string& part = parts[p];
    if (part.empty()) continue;
    if (part[0] == 'w') {
      out.num_warps = static_cast<int>(number(part.substr(1)));
      continue;
    }
    bool matched = false;
    for (const auto& l : letters) {
      const std::string prefix = l.first;
      if (part.compare(0, prefix.size(), prefix) == 0 && part.size() > prefix.size() &&
          (std::isdigit(static_cast<unsigned char>(part[prefix.size()])) || part[prefix.size()] == '-')) {
        out.constexprs[l.second] = number(part.substr(prefix.size()));
        matched = true;
        break;
      }
    }
    if (matched) continue;
    // a dtype group: p1g1s0
    for (std::size_t i = 0; i < part.size();) {
      const char letter = part[i++];
      std::size_t j = i;
      while (j < part.size() && std::isdigit(static_cast<unsigned char>(part[j]))) ++j;
      const char* name = letter == 'p' ? "P_DTYPE" : letter == 'g' ? "G_DTYPE" : "S_DTYPE";
      out.constexprs[name] = number(part.substr(i, j - i));
      i = j;
    }
  }
  return out;
}

json add_variant(const TempDir& dir, const std::string& key, int arch, const VariantOptions& options) {
  const KeyParts parts = parse_key(key);
  const KernelSpec spec = options.spec.kernel.empty() ? kernel_spec(parts.kernel) : options.spec;
  const std::string cubin_name = key + ".sm" + std::to_string(arch) + ".cubin";
  FakeCubin cubin;
  cubin.payload = options.payload.empty() ? "cubin of " + cubin_name : options.payload;
  cubin.entry = spec.name;
  cubin.arch = arch;
  for (const std::string& word : spec.signature) {
    cubin.param_sizes.push_back(static_cast<std::uint32_t>(luminav::ArgType::parse(word).size));
  }
  for (int t = 0; t < options.trailing; ++t) cubin.param_sizes.push_back(8);
  cubin.threads = static_cast<std::uint32_t>(parts.num_warps * 32);
  const auto bytes = make_fake_cubin(cubin);
  write_bytes(dir.file(cubin_name), bytes);
  json e = {
      {"key", key},
      {"kernel", spec.kernel},
      {"name", spec.name},
      {"entry", spec.name},
      {"cubin", cubin_name},
      {"sha256", luminav::sha256_hex(bytes.data(), bytes.size())},
      {"target", {{"backend", "cuda"}, {"arch", arch}, {"warp_size", 32}}},
      {"triton_version", options.triton_version},
      {"num_warps", parts.num_warps},
      {"num_ctas", 1},
      {"num_stages", 3},
      {"shared_mem", 0},
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
  return e;
}

json add_variant(const TempDir& dir, const std::string& key, int arch, const std::string& payload,
                 const KernelSpec& spec) {
  VariantOptions options;
  options.payload = payload;
  options.spec = spec;
  return add_variant(dir, key, arch, options);
}

json manifest_with(const std::vector<json>& kernels) {
  return json{{"format", "luminamoon-aot-bundle"},
              {"format_version", 2},
              {"table_cols", 21},  // the engine's (engine/group_launch.h kTableCols)
              {"created_by", "luminamoon 0.1.0"},
              {"triton_version", "3.6.0"},
              {"kernels", kernels}};
}

void write_manifest(const TempDir& dir, const json& manifest) {
  write_text(dir.file("manifest.json"), manifest.dump(2));
}

}  // namespace luminav_test

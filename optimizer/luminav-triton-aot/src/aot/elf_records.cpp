// src/aot/elf_records.cpp: the readers of a cubin's record sections: a kernel's .nv.info
// attributes (rule E26), its notes (E28) and the .nv.compat records (E29), as parse_cubin
// (elf.cpp) calls them; each refuses with kElfSection naming the section, check for check the
// same as python/luminamoon/aot/cubin_records.py
#include <cstring>

#include "aot/elf_internal.h"

namespace luminav {
namespace elf {
namespace detail {

namespace {

// ptxas's notes (owner "NVIDIA Corp"): the CUDA version (8 or 12 bytes) and the toolkit
// information (a version word, five offsets into the NUL-terminated strings that follow)
constexpr std::uint32_t kNtCudaVersion = 1000, kNtCudaToolkitInfo = 2000;
constexpr std::uint64_t kToolkitInfoHeader = 24;
const char kNoteOwner[] = "NVIDIA Corp";  // with its NUL: 12 bytes

// The attributes NVIDIA's cuobjdump (CUDA 13.4, in the Triton 3.9 wheel) names: 0x01-0x61 but 0x56
// and 0x60, and three that ptxas 13.3 and 13.4 write though no cuobjdump names them, each in the
// one format it writes: 0x66 (4 bytes), 0x6b (a half-word), 0x6d (a byte).
bool known_attr(unsigned a) {
  return (a >= 0x01 && a <= 0x61 && a != 0x56 && a != 0x60) || a == 0x66 || a == 0x6b || a == 0x6d;
}

bool instr_offsets_attr(unsigned a) {
  return a == kExitInstrOffsets || a == kS2rctaidInstrOffsets || a == kLdCachemodInstrOffsets ||
         a == kAtomSysInstrOffsets || a == kCoopGroupInstrOffsets || a == kAtomf16EmulInstrOffsets ||
         a == kIntWarpWideInstrOffsets || a == kMbarrierInstrOffsets || a == kSyscallOffsets ||
         a == kSwWarMembarSysInstrOffsets || a == kStackCanaryTrapOffsets || a == kLocalCtaAsyncStoreOffsets;
}

}  // namespace

FunctionInfo NvInfoReader::read() {
  FunctionInfo fi;
  std::uint64_t p = 0;
  while (p < size_) {
    if (p + 4 > size_) bad("a record at " + std::to_string(p) + " is cut short");
    const unsigned fmt = blob_[p], attr = blob_[p + 1];
    const unsigned char* val = nullptr;
    std::uint64_t len = 0;
    if (fmt == kEifmtSval) {
      len = le(blob_ + p + 2, 2);
      if (p + 4 + len > size_) {
        bad("attribute " + hex(attr) + " at " + std::to_string(p) + " of " + std::to_string(len) +
            " bytes is cut short");
      }
      val = blob_ + p + 4;
      p += 4 + len;
    } else if (fmt == kEifmtNval || fmt == kEifmtBval || fmt == kEifmtHval) {
      val = blob_ + p + 2;
      len = 2;
      p += 4;
    } else {
      bad("attribute " + hex(attr) + " at " + std::to_string(p) + " has format " + std::to_string(fmt));
    }
    if (!known_attr(attr)) bad("attribute " + hex(attr) + " is not one this reader knows");
    if (!per_function_ && fmt == kEifmtSval && (len < 4 || le(val, 4) >= nsyms_)) {
      // the module-wide .nv.info: each record is about a function, its symbol first
      bad("attribute " + hex(attr) + " does not name a symbol of " + std::to_string(nsyms_));
    }
    auto need = [&](std::optional<std::uint64_t> sval_size, const char* what) {
      if (fmt != kEifmtSval || (sval_size && len != *sval_size)) {
        bad(std::string(what) + " (attribute " + hex(attr) + ") has format " + std::to_string(fmt) + " and " +
            std::to_string(len) + " bytes");
      }
    };
    if (attr == kFrameSize || attr == kMinStackSize || attr == kMaxStackSize || attr == kRegcount) {
      need(8, "a per-function value");
      const std::uint64_t sym = le(val, 4);
      if (sym >= nsyms_) {
        bad("attribute " + hex(attr) + " names symbol " + std::to_string(sym) + " of " + std::to_string(nsyms_));
      }
      fi.symbol_values.emplace_back(attr, static_cast<std::uint32_t>(sym));
    } else if (attr == kKparamInfo) {
      need(12, "a parameter record");
      KernelParam q;
      q.ordinal = static_cast<std::uint32_t>(le(val + 4, 2));
      q.offset = static_cast<std::uint32_t>(le(val + 6, 2));
      q.size = static_cast<std::uint32_t>((le(val + 8, 4) >> 18) & 0x3fff);
      fi.params.push_back(q);
    } else if (attr == kCbankParamSize) {
      if (fmt != kEifmtHval) {
        bad("the parameter bank size (attribute " + hex(attr) + ") has format " + std::to_string(fmt));
      }
      fi.cbank_param_size = static_cast<std::uint32_t>(le(val, 2));
    } else if (attr == kParamCbank) {
      need(8, "the parameter bank");
      const std::uint64_t sym = le(val, 4), word = le(val + 4, 4);
      if (sym >= nsyms_) {
        bad("the parameter bank names symbol " + std::to_string(sym) + " of " + std::to_string(nsyms_));
      }
      fi.param_cbank = FunctionInfo::ParamCbank{static_cast<std::uint32_t>(sym),
                                                static_cast<std::uint32_t>(word & 0xffff),
                                                static_cast<std::uint32_t>(word >> 16)};
      ++fi.param_cbank_count;
    } else if (attr == kExterns) {
      need(std::nullopt, "external symbols");
      bool ok = len % 4 == 0;
      for (std::uint64_t k = 0; ok && k < len; k += 4) ok = le(val + k, 4) < nsyms_;
      if (!ok) bad("external symbols (attribute " + hex(attr) + ") name symbols out of range");
    } else if (attr == kReqntid || attr == kMaxThreads) {
      need(12, "a block size");
      const std::array<std::uint32_t, 3> dims = {static_cast<std::uint32_t>(le(val, 4)),
                                                 static_cast<std::uint32_t>(le(val + 4, 4)),
                                                 static_cast<std::uint32_t>(le(val + 8, 4))};
      (attr == kReqntid ? fi.reqntid : fi.max_threads) = dims;
    } else if (instr_offsets_attr(attr)) {
      need(std::nullopt, "instruction offsets");
      if (len % 4) bad("instruction offsets (attribute " + hex(attr) + ") of " + std::to_string(len) + " bytes");
      for (std::uint64_t k = 0; k < len; k += 4) {
        const std::uint64_t o = le(val + k, 4);
        if (!code_size_ || o >= *code_size_) {
          bad("instruction offset " + std::to_string(o) + " (attribute " + hex(attr) + ") outside the code (" +
              (code_size_ ? std::to_string(*code_size_) : std::string("None")) + " bytes)");
        }
      }
    } else if (attr == 0x66 || attr == 0x6b || attr == 0x6d) {
      const unsigned want_fmt = attr == 0x66 ? kEifmtSval : attr == 0x6b ? kEifmtHval : kEifmtBval;
      if (fmt != want_fmt || (attr == 0x66 && len != 4)) {
        bad("attribute " + hex(attr) + " has format " + std::to_string(fmt) + " and " + std::to_string(len) +
            " bytes");
      }
    }
  }
  return fi;
}

// E28: a note section is whole records (12-byte header, the owner, the description, each padded
// to 4 bytes) of ptxas's two kinds.
void check_notes(const unsigned char* blob, std::uint64_t size, std::uint32_t index) {
  auto bad = [index](const std::string& what) { section("note section " + std::to_string(index) + ": " + what); };
  std::uint64_t p = 0;
  while (p < size) {
    if (p + 12 > size) bad("a note at " + std::to_string(p) + " is cut short");
    const std::uint64_t namesz = le(blob + p, 4), descsz = le(blob + p + 4, 4), ntype = le(blob + p + 8, 4);
    const std::uint64_t name_at = p + 12, desc_at = name_at + (namesz + 3) / 4 * 4;
    const std::uint64_t end = desc_at + (descsz + 3) / 4 * 4;
    if (end > size) {
      bad("the note at " + std::to_string(p) + " (" + std::to_string(namesz) + " + " + std::to_string(descsz) +
          " bytes) is cut short");
    }
    if (namesz != sizeof kNoteOwner || std::memcmp(blob + name_at, kNoteOwner, sizeof kNoteOwner) != 0) {
      bad("the note at " + std::to_string(p) + " is not NVIDIA's (its owner is " + std::to_string(namesz) + " bytes)");
    }
    const unsigned char* desc = blob + desc_at;
    if (ntype == kNtCudaVersion) {
      if (descsz != 8 && descsz != 12) {
        bad("the CUDA version note at " + std::to_string(p) + " is " + std::to_string(descsz) + " bytes");
      }
    } else if (ntype == kNtCudaToolkitInfo) {
      bool ok = descsz > kToolkitInfoHeader && desc[descsz - 1] == 0;
      for (std::uint64_t k = 0; ok && k < 5; ++k) ok = le(desc + 4 + 4 * k, 4) < descsz - kToolkitInfoHeader;
      if (!ok) {
        bad("the toolkit note at " + std::to_string(p) + " (" + std::to_string(descsz) +
            " bytes) has strings out of bounds");
      }
    } else {
      bad("the note at " + std::to_string(p) + " has type " + std::to_string(ntype));
    }
    p = end;
  }
}

// E29: .nv.compat holds whole records of a known format, each attribute once: the EICOMPAT ids
// ptxas 12.8-13.4 writes lie in 0x02-0x0e (0 is EICOMPAT_ATTR_ERROR); cuobjdump refuses a
// .nv.compat that names one attribute twice.
void check_compat(const unsigned char* blob, std::uint64_t size, std::uint32_t index) {
  auto bad = [index](const std::string& what) { section(".nv.compat section " + std::to_string(index) + ": " + what); };
  bool seen[256] = {};
  std::uint64_t p = 0;
  while (p < size) {
    if (p + 4 > size) bad("a record at " + std::to_string(p) + " is cut short");
    const unsigned fmt = blob[p], attr = blob[p + 1];
    if (fmt == kEifmtSval) {
      const std::uint64_t len = le(blob + p + 2, 2);
      if (p + 4 + len > size) {
        bad("attribute " + hex(attr) + " at " + std::to_string(p) + " of " + std::to_string(len) +
            " bytes is cut short");
      }
      p += 4 + len;
    } else if (fmt == kEifmtNval || fmt == kEifmtBval || fmt == kEifmtHval) {
      p += 4;
    } else {
      bad("attribute " + hex(attr) + " at " + std::to_string(p) + " has format " + std::to_string(fmt));
    }
    if (attr < 0x01 || attr > 0x0e || seen[attr]) bad("attribute " + hex(attr) + " is unknown or repeated");
    seen[attr] = true;
  }
}

}  // namespace detail
}  // namespace elf
}  // namespace luminav

"""aot/cubin_format.py: the cubin (CUDA ELF) format as the bundle rule book checks it: the ELF
header and table layouts, section types and flags, note owners, EIATTR attribute ids and formats
(docs/bundle-format.md, "Cubins"), and the types aot/cubin.py reads a cubin into. The C++ loader
has the same table (optimizer/luminav-triton-aot/src/aot/elf.cpp).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
ET_EXEC = 2
ELF_ABI_VERSIONS = (7, 8)  # the e_flags layouts read here (ptxas of CUDA 11-12.7, 12.8+)
EHDR_SIZE, SHDR_SIZE, PHDR_SIZE, SYM_SIZE, RELA_SIZE, REL_SIZE = 64, 64, 56, 24, 24, 16
_EHDR = struct.Struct("<HHIQQQIHHHHHH")  # from offset 16
_SHDR = struct.Struct("<IIQQQQIIQQ")
_PHDR = struct.Struct("<IIQQQQQQ")
_SYM = struct.Struct("<IBBHQQ")

SHT_NULL, SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA = 0, 1, 2, 3, 4
SHT_NOTE, SHT_NOBITS, SHT_REL = 7, 8, 9
SHT_CUDA_INFO, SHT_CUDA_CALLGRAPH, SHT_CUDA_RELOCINFO = 0x70000000, 0x70000001, 0x7000000B
SHT_CUDA_COMPAT = 0x70000086  # .nv.compat: EICOMPAT records (what the driver may finalize for)
# The Mercury copy of the code that ptxas writes for sm_100 and later: .nv.capmerc.text.<kernel>
# (the code), .nv.merc.symtab (its symbol table), .nv.merc.rela.* (its relocations),
# .nv.merc.nv.info* (its attributes), .nv.merc.nv.callgraph, and the Mercury views of data
# sections (.nv.merc.nv.constant.pic, .nv.merc.nv.global.init, .nv.merc.nv.shared.reserved.*).
# Every one carries SHF_CUDA_MERCURY.
SHT_CUDA_MERC_GLOBAL_INIT = 0x70000008
SHT_CUDA_MERC_RESERVED_SHARED = 0x70000015
SHT_CUDA_CAPMERC = 0x70000016
SHT_CUDA_MERC_CONSTANT_PIC = 0x7000007D
SHT_CUDA_MERC_RELA = 0x70000082
SHT_CUDA_MERC_INFO = 0x70000083
SHT_CUDA_MERC_SYMTAB = 0x70000085
SHT_CUDA_MERC_CALLGRAPH = 0x7000008A
MERCURY_TYPES = (SHT_CUDA_MERC_GLOBAL_INIT, SHT_CUDA_MERC_RESERVED_SHARED, SHT_CUDA_CAPMERC,
                 SHT_CUDA_MERC_CONSTANT_PIC, SHT_CUDA_MERC_RELA, SHT_CUDA_MERC_INFO,
                 SHT_CUDA_MERC_SYMTAB, SHT_CUDA_MERC_CALLGRAPH)
# The section types of a cubin ptxas writes for a Triton kernel (every cubin of Triton 3.4-3.9's
# bundles, sm_80 to sm_121). The driver parses more CUDA types (prototypes, resolved relocations,
# metadata, UFT...), each its own way: a section retyped to one of them is refused, not parsed.
ALLOWED_SECTION_TYPES = (SHT_NULL, SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOTE,
                         SHT_NOBITS, SHT_REL, SHT_CUDA_INFO, SHT_CUDA_CALLGRAPH,
                         SHT_CUDA_RELOCINFO, SHT_CUDA_COMPAT) + MERCURY_TYPES
SHF_ALLOC, SHF_EXECINSTR, SHF_INFO_LINK = 0x2, 0x4, 0x40
SHF_CUDA_MERCURY = 0x10000000  # a section of the Mercury copy (types above, or PROGBITS data)
SHF_NOTE_BITS = 0x01000000 | 0x02000000  # the OS bits ptxas sets on its two notes
# write, alloc, execinstr, info-link, the one CUDA bit ptxas sets on some code (0x100000), the
# Mercury bit and the notes' bits
ALLOWED_SECTION_FLAGS = 0x1 | 0x2 | 0x4 | 0x40 | 0x100000 | SHF_CUDA_MERCURY | SHF_NOTE_BITS
# The data sections the Mercury copy may share with the SASS's (the same file bytes, viewed
# twice): .nv.merc.nv_debug_ptx_txt, .nv.merc.debug_str (PROGBITS), .nv.merc.nv.constant.pic
# (of .nv.constant4) and .nv.merc.nv.global.init (of .nv.global.init)
MERCURY_VIEW_TYPES = (SHT_PROGBITS, SHT_CUDA_MERC_CONSTANT_PIC, SHT_CUDA_MERC_GLOBAL_INIT)
# ptxas's notes: owner "NVIDIA Corp", the CUDA version (.note.nv.cuver / .note.nv.cuinfo: 12
# bytes in CUDA 12.9, 8 from 13.1 on) and the toolkit information (.note.nv.tkinfo: a version
# word, five offsets into the NUL-terminated strings that follow: object file, tool name,
# version, branch, options)
NOTE_OWNER = b"NVIDIA Corp\0"
NT_CUDA_VERSION, NT_CUDA_TOOLKIT_INFO = 1000, 2000
CUDA_VERSION_NOTE_SIZES = (8, 12)
TOOLKIT_INFO_HEADER = 24
# .nv.compat attributes: the EICOMPAT ids ptxas 12.8-13.4 writes lie in 0x02-0x0e; 0 is
# EICOMPAT_ATTR_ERROR. cuobjdump refuses a .nv.compat that names one attribute twice.
COMPAT_ATTRS = range(0x01, 0x0F)
PT_LOAD, PT_PHDR = 1, 6
SHN_LORESERVE = 0xFF00
STT_OBJECT, STT_FUNC, STT_SECTION = 1, 2, 3
STB_GLOBAL = 1
STO_CUDA_ENTRY = 0x10  # st_other of a kernel's entry symbol
# sh_entsize of the sections without table entries checked above: 8 for the call graphs (pairs
# of 4-byte words), 0 for every other
ENTSIZE_WRITTEN = {SHT_CUDA_CALLGRAPH: 8, SHT_CUDA_MERC_CALLGRAPH: 8}
CALLGRAPH_MARKERS = 0xFFFFFFF0  # callgraph words at or above this are markers, not symbols

# .nv.info record formats and the attributes checked here (NVIDIA's EIATTR list)
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_MAX_THREADS = 0x05
EIATTR_PARAM_CBANK = 0x0A
EIATTR_REQNTID = 0x10
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_EXIT_INSTR_OFFSETS = 0x1C
EIATTR_S2RCTAID_INSTR_OFFSETS = 0x1D
EIATTR_MAX_STACK_SIZE = 0x23
EIATTR_LD_CACHEMOD_INSTR_OFFSETS = 0x25
EIATTR_ATOM_SYS_INSTR_OFFSETS = 0x27
EIATTR_COOP_GROUP_INSTR_OFFSETS = 0x28
EIATTR_EXTERNS = 0x0F
EIATTR_ATOMF16_EMUL_INSTR_OFFSETS = 0x2D
EIATTR_INT_WARP_WIDE_INSTR_OFFSETS = 0x31
EIATTR_MBARRIER_INSTR_OFFSETS = 0x39
EIATTR_SYSCALL_OFFSETS = 0x46
EIATTR_SW_WAR_MEMBAR_SYS_INSTR_OFFSETS = 0x47
EIATTR_STACK_CANARY_TRAP_OFFSETS = 0x57
EIATTR_LOCAL_CTA_ASYNC_STORE_OFFSETS = 0x59
EIATTR_REGCOUNT = 0x2F
# The attributes NVIDIA's cuobjdump (CUDA 13.4, in the Triton 3.9 wheel) names: 0x01-0x61 but
# 0x56 and 0x60, and three that ptxas 13.3 and 13.4 write though no cuobjdump names them, each in
# the one format it writes: 0x66 (4 bytes), 0x6b (a half-word), 0x6d (a byte). Another id is
# refused: the driver would read its bytes by rules this reader cannot check.
KNOWN_ATTRS = frozenset(range(0x01, 0x62)) - {0x56, 0x60} | {0x66, 0x6B, 0x6D}
UNNAMED_ATTR_FORMATS = {0x66: (EIFMT_SVAL, 4), 0x6B: (EIFMT_HVAL, None), 0x6D: (EIFMT_BVAL, None)}
# (symbol index u32, value u32) records
SYMBOL_VALUE_ATTRS = (EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE, EIATTR_MAX_STACK_SIZE,
                      EIATTR_REGCOUNT)
INSTR_OFFSET_ATTRS = (EIATTR_EXIT_INSTR_OFFSETS, EIATTR_S2RCTAID_INSTR_OFFSETS,
                      EIATTR_LD_CACHEMOD_INSTR_OFFSETS, EIATTR_ATOM_SYS_INSTR_OFFSETS,
                      EIATTR_COOP_GROUP_INSTR_OFFSETS, EIATTR_ATOMF16_EMUL_INSTR_OFFSETS,
                      EIATTR_INT_WARP_WIDE_INSTR_OFFSETS, EIATTR_MBARRIER_INSTR_OFFSETS,
                      EIATTR_SYSCALL_OFFSETS, EIATTR_SW_WAR_MEMBAR_SYS_INSTR_OFFSETS,
                      EIATTR_STACK_CANARY_TRAP_OFFSETS, EIATTR_LOCAL_CTA_ASYNC_STORE_OFFSETS)
# E30: the module-wide records ptxas writes for every kernel, at least once each (the SASS's and the
# Mercury copy's alike): the driver reads them at the first launch, and a kernel without them
# breaks the CUDA context (a sticky error) instead of being refused at load
KERNEL_MODULE_ATTRS = ((EIATTR_FRAME_SIZE, "EIATTR_FRAME_SIZE"),
                       (EIATTR_MIN_STACK_SIZE, "EIATTR_MIN_STACK_SIZE"),
                       (EIATTR_REGCOUNT, "EIATTR_REGCOUNT"))
PARAM_BANK_PREFIX = ".nv.constant0."  # the section a kernel's EIATTR_PARAM_CBANK names


class CubinError(ValueError):
    """The bytes are not a whole, well-formed cubin; ``code`` is the rule book's
    (``truncated``, ``elf_header`` or ``elf_section``)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


@dataclass(frozen=True)
class KernelParam:
    ordinal: int
    offset: int
    size: int


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    align: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    type: int
    bind: int
    other: int
    shndx: int


@dataclass(frozen=True)
class FunctionInfo:
    """The ``.nv.info`` attributes of one function (the section whose sh_info is its code)."""

    params: Tuple[KernelParam, ...]
    cbank_param_size: Optional[int]  # EIATTR_CBANK_PARAM_SIZE
    param_cbank: Optional[Tuple[int, int, int]]  # EIATTR_PARAM_CBANK: (symbol, offset, size)
    reqntid: Optional[Tuple[int, int, int]]  # EIATTR_REQNTID
    max_threads: Optional[Tuple[int, int, int]]  # EIATTR_MAX_THREADS
    param_cbank_count: int = 0  # how many EIATTR_PARAM_CBANK records
    # (attribute, symbol) of each EIATTR_FRAME_SIZE, MIN_STACK_SIZE, MAX_STACK_SIZE, REGCOUNT
    symbol_values: Tuple[Tuple[int, int], ...] = ()


@dataclass(frozen=True)
class CubinInfo:
    size: int
    elf_abi_version: int
    e_flags: int
    arch: int  # SM arch, e.g. 90
    sections: Tuple[Section, ...]
    symbols: Tuple[Symbol, ...]
    # code section index -> the .nv.info sections whose sh_info names it
    function_info: Dict[int, Tuple[FunctionInfo, ...]] = field(default_factory=dict)
    # the Mercury copy (sm_100 and later): .nv.merc.symtab, and capmerc section index -> the
    # .nv.merc.nv.info sections whose sh_info names it
    merc_symbols: Tuple[Symbol, ...] = ()
    merc_function_info: Dict[int, Tuple[FunctionInfo, ...]] = field(default_factory=dict)

    @property
    def section_names(self) -> Tuple[str, ...]:
        return tuple(s.name for s in self.sections)

    def entry_symbols(self, name: str) -> List[Symbol]:
        """Kernel entry symbols named ``name``: global functions marked as CUDA entries
        (STO_CUDA_ENTRY), defined in a code section named ``.text.<name>`` (the driver finds a
        kernel's code by that name: cuModuleGetFunction fails with CUDA_ERROR_NOT_FOUND
        otherwise)."""
        return [s for s in self.symbols if s.name == name and s.type == STT_FUNC
                and s.bind == STB_GLOBAL and s.other & STO_CUDA_ENTRY
                and 0 < s.shndx < len(self.sections)
                and self.sections[s.shndx].type == SHT_PROGBITS
                and self.sections[s.shndx].flags & SHF_EXECINSTR
                and self.sections[s.shndx].name == ".text." + name]

    @property
    def params(self) -> Dict[str, Tuple[KernelParam, ...]]:
        """Entry name -> its parameters in ordinal order, for every kernel with one .nv.info."""
        out: Dict[str, Tuple[KernelParam, ...]] = {}
        for s in self.symbols:
            if s.type == STT_FUNC and s.bind == STB_GLOBAL:
                infos = self.function_info.get(s.shndx, ())
                if len(infos) == 1:
                    out[s.name] = tuple(sorted(infos[0].params, key=lambda p: p.ordinal))
        return out

    def merc_entry_symbols(self, name: str) -> List[Symbol]:
        """The same in the Mercury symbol table: the kernel's entry in its Mercury code
        (a ``.nv.capmerc.text`` section); none in a cubin without a Mercury copy."""
        return [s for s in self.merc_symbols if s.name == name and s.type == STT_FUNC
                and s.bind == STB_GLOBAL and s.other & STO_CUDA_ENTRY
                and 0 < s.shndx < len(self.sections)
                and self.sections[s.shndx].type == SHT_CUDA_CAPMERC]

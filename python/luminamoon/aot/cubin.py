"""The cubin (CUDA ELF) reader of the bundle rule book: every check, in the rule book's order.

A cubin is an ELF64 little-endian executable for EM_CUDA. :func:`parse_cubin` checks that every
header, offset, size and index is in bounds and every table well formed (docs/bundle-format.md,
"Cubins": rules E1-E30), so that nothing malformed ever reaches the CUDA driver, and reads what
the bundle checks need: the SM arch from ``e_flags``, the symbol table, and per kernel the
``.nv.info`` attributes whose ``EIATTR_KPARAM_INFO`` records are its parameters (what
``cuFuncGetParamInfo`` reports) and ``EIATTR_REQNTID`` its block size; for the cubins of sm_100
and later also the Mercury copy of each kernel (``.nv.capmerc.text.<kernel>``, the
``.nv.merc.*`` sections and their own symbol table), which the driver can finalize instead of
the SASS.

The C++ loader has the same reader (optimizer/luminav-triton-aot/src/aot/elf.cpp); the shared
corpus under tests/data/bundles holds cubins both must refuse with the same code.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

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


def arch_from_flags(abi_version: int, e_flags: int) -> int:
    """The SM arch in ``e_flags``: the low byte for ELF ABI version 7 (0x5a = 90), the second
    byte for version 8 (the ptxas of CUDA 12.8 and later: 0x5a04 is sm_90)."""
    return e_flags & 0xFF if abi_version == 7 else (e_flags >> 8) & 0xFF


def _pow2_or_zero(v: int) -> bool:
    return v & (v - 1) == 0


def parse_cubin(data: bytes) -> CubinInfo:
    """Checks ``data`` against rules E1-E30 and reads what the bundle checks need.

    Raises :class:`CubinError` at the first rule broken, in the rule book's order.
    """
    n = len(data)

    def truncated(msg: str) -> CubinError:
        return CubinError("truncated", f"{msg} but the file has {n} bytes: truncated")

    def header(msg: str) -> CubinError:
        return CubinError("elf_header", msg)

    def section(msg: str) -> CubinError:
        return CubinError("elf_section", msg)

    # E1-E12: the ELF header
    if n < EHDR_SIZE:
        raise CubinError("truncated", f"{n} bytes is too short for an ELF64 header (64 bytes): "
                         "truncated")
    if data[:4] != ELF_MAGIC:
        raise header(f"does not start with the ELF magic 7f 45 4c 46 (found {data[:4].hex(' ')})")
    if data[4] != 2 or data[5] != 1:
        raise header(f"not a little-endian ELF64 file (class {data[4]}, data {data[5]})")
    if data[6] != 1:
        raise header(f"ELF identification version {data[6]}, not 1")
    (e_type, e_machine, _e_version, _e_entry, e_phoff, e_shoff, e_flags, e_ehsize,
     e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx) = _EHDR.unpack_from(data, 16)
    if e_machine != EM_CUDA:
        raise header(f"ELF machine is {e_machine}, not CUDA ({EM_CUDA})")
    abi = data[8]
    if abi not in ELF_ABI_VERSIONS:
        raise header(f"ELF ABI version {abi}, not one whose e_flags layout this reader knows "
                     f"({', '.join(map(str, ELF_ABI_VERSIONS))})")
    if e_type != ET_EXEC:
        raise header(f"ELF type {e_type}, not an executable (2)")
    if e_ehsize != EHDR_SIZE:
        raise header(f"ELF header size {e_ehsize}, not 64")
    if e_shentsize != SHDR_SIZE:
        raise header(f"section header size {e_shentsize}, not 64")
    if e_shnum == 0 or e_shnum >= SHN_LORESERVE:
        raise header(f"section count {e_shnum} (extended numbering is not used by cubins)")
    if e_shstrndx == 0 or e_shstrndx >= e_shnum:
        raise header(f"section name table index {e_shstrndx} out of range 1..{e_shnum - 1}")
    if e_phnum and (e_phentsize != PHDR_SIZE or e_phnum == 0xFFFF):
        raise header(f"program header table of {e_phnum} entries of {e_phentsize} bytes "
                     "(entries are 56 bytes)")
    # E13-E16: everything the headers point at lies inside the file
    if e_shoff + e_shnum * SHDR_SIZE > n:
        raise truncated(f"the section header table ends at byte {e_shoff + e_shnum * SHDR_SIZE}")
    if e_phnum and e_phoff + e_phnum * PHDR_SIZE > n:
        raise truncated(f"the program header table ends at byte {e_phoff + e_phnum * PHDR_SIZE}")
    raw = [_SHDR.unpack_from(data, e_shoff + i * SHDR_SIZE) for i in range(e_shnum)]
    for i, (_nm, typ, _fl, _addr, off, size, _lk, _inf, _al, _es) in enumerate(raw):
        if typ not in (SHT_NOBITS, SHT_NULL) and off + size > n:
            raise truncated(f"section {i} ends at byte {off + size}")
    for i in range(e_phnum):
        (_pt, _pf, p_offset, _va, _pa, p_filesz, p_memsz, p_align) = _PHDR.unpack_from(
            data, e_phoff + i * PHDR_SIZE)
        if p_offset + p_filesz > n:
            raise truncated(f"segment {i} ends at byte {p_offset + p_filesz}")
    segments = [_PHDR.unpack_from(data, e_phoff + i * PHDR_SIZE) for i in range(e_phnum)]
    for i, (p_type, p_flags, _off, p_vaddr, p_paddr, p_filesz, p_memsz, p_align) in \
            enumerate(segments):
        if p_type not in (PT_LOAD, PT_PHDR) or p_flags & ~0x7 or p_vaddr or p_paddr or \
                p_filesz > p_memsz or not _pow2_or_zero(p_align):
            raise section(f"segment {i}: type {p_type}, flags {p_flags:#x}, addresses "
                          f"{p_vaddr:#x}/{p_paddr:#x}, file size {p_filesz}, memory size "
                          f"{p_memsz}, alignment {p_align} (a cubin's segments are LOAD or "
                          "PHDR at address 0)")
    # E17-E20: the section table
    if data[e_shoff:e_shoff + SHDR_SIZE] != bytes(SHDR_SIZE):
        raise section("section 0 is not the null section (all zero)")
    for i in range(1, e_shnum):
        _nm, typ, flags, addr, off, size, link, _inf, align, entsize = raw[i]
        if typ not in ALLOWED_SECTION_TYPES:
            raise section(f"section {i} has type {typ:#x}")
        if flags & ~ALLOWED_SECTION_FLAGS:
            raise section(f"section {i} has flags {flags:#x}")
        if flags & SHF_NOTE_BITS and typ != SHT_NOTE:
            raise section(f"section {i} (type {typ:#x}) has flags {flags:#x} (bits 0x1000000 "
                          "and 0x2000000 are the notes')")
        if (typ in MERCURY_TYPES) != bool(flags & SHF_CUDA_MERCURY) and not (
                typ == SHT_PROGBITS and not flags & SHF_EXECINSTR):
            raise section(f"section {i} (type {typ:#x}) has flags {flags:#x} (the Mercury bit "
                          "0x10000000 marks the Mercury types and Mercury data only)")
        if addr:
            raise section(f"section {i} has address {addr:#x} (a cubin's sections are at 0)")
        if not _pow2_or_zero(align):
            raise section(f"section {i} has alignment {align}")
        want_ent = {SHT_SYMTAB: SYM_SIZE, SHT_CUDA_MERC_SYMTAB: SYM_SIZE, SHT_RELA: RELA_SIZE,
                    SHT_CUDA_MERC_RELA: RELA_SIZE, SHT_REL: REL_SIZE,
                    SHT_CUDA_RELOCINFO: 8}.get(typ)
        if want_ent is not None and (entsize != want_ent or size % want_ent):
            raise section(f"section {i} (type {typ}) has entries of {entsize} bytes and size "
                          f"{size} (entries are {want_ent} bytes)")
        if want_ent is None and entsize != ENTSIZE_WRITTEN.get(typ, 0):
            raise section(f"section {i} (type {typ:#x}) has sh_entsize {entsize:#x} (ptxas "
                          f"writes {ENTSIZE_WRITTEN.get(typ, 0)} for a section of this type)")
        if link >= e_shnum:
            raise section(f"section {i} links section {link}, out of range")
        link_type = raw[link][1] if link else None
        if typ in (SHT_SYMTAB, SHT_CUDA_MERC_SYMTAB) and link_type != SHT_STRTAB:
            raise section(f"symbol table {i} links section {link}, not a string table")
        needs_symtab = typ in (SHT_REL, SHT_RELA, SHT_CUDA_INFO, SHT_CUDA_CALLGRAPH) or (
            typ == SHT_PROGBITS and flags & SHF_EXECINSTR)
        if needs_symtab and link and link_type != SHT_SYMTAB:
            raise section(f"section {i} links section {link}, not the symbol table")
        needs_merc_symtab = typ in (SHT_CUDA_MERC_RELA, SHT_CUDA_MERC_INFO,
                                    SHT_CUDA_MERC_CALLGRAPH, SHT_CUDA_CAPMERC)
        if needs_merc_symtab and link and link_type != SHT_CUDA_MERC_SYMTAB:
            raise section(f"section {i} links section {link}, not the Mercury symbol table")
        if typ == SHT_NOTE and link and link_type != SHT_NOTE:
            raise section(f"note {i} links section {link}, not a note")
        if typ == SHT_STRTAB and (size == 0 or data[off] != 0 or data[off + size - 1] != 0):
            raise section(f"string table {i} does not start and end with a NUL byte")
    shstr = raw[e_shstrndx]
    if shstr[1] != SHT_STRTAB:
        raise section(f"section name table {e_shstrndx} has type {shstr[1]:#x}, not a string "
                      "table")
    for i in range(e_shnum):
        if raw[i][0] >= shstr[5]:
            raise section(f"section {i}'s name at {raw[i][0]} is outside the name table "
                          f"({shstr[5]} bytes)")
    # E21: no two extents of the file overlap, but for a Mercury view of a data section: the
    # same bytes, a type of MERCURY_VIEW_TYPES, the flags of the section it views plus the
    # Mercury bit (each section viewed once at most)
    extents = [(0, EHDR_SIZE, 0, "the ELF header", -1),
               (e_shoff, e_shnum * SHDR_SIZE, 0, "the section header table", -1)]
    if e_phnum:
        extents.append((e_phoff, e_phnum * PHDR_SIZE, 0, "the program header table", -1))
    extents += [(s[4], s[5], 1 if s[2] & SHF_CUDA_MERCURY else 0, f"section {i}", i)
                for i, s in enumerate(raw) if s[1] not in (SHT_NOBITS, SHT_NULL) and s[5] > 0]
    extents.sort(key=lambda x: (x[0], x[1], x[2]))
    for a, b in zip(extents, extents[1:]):
        if a[0] + a[1] <= b[0]:
            continue
        if a[4] >= 0 and (a[0], a[1], a[2], b[2]) == (b[0], b[1], 0, 1):
            sa, sb = raw[a[4]], raw[b[4]]
            if sa[1] == SHT_PROGBITS and not sa[2] & SHF_EXECINSTR and \
                    sb[1] in MERCURY_VIEW_TYPES and sb[2] == sa[2] | SHF_CUDA_MERCURY:
                continue
        raise section(f"{a[3]} and {b[3]} overlap")
    # ... and every allocated section with file bytes lies inside a LOAD segment's file bytes
    loads = [(sg[2], sg[2] + sg[5]) for sg in segments if sg[0] == PT_LOAD]
    if e_phnum:
        for i, s in enumerate(raw):
            if s[2] & SHF_ALLOC and s[1] not in (SHT_NOBITS, SHT_NULL) and s[5] > 0 and not any(
                    lo <= s[4] and s[4] + s[5] <= hi for lo, hi in loads):
                raise section(f"section {i} is allocated but in no loadable segment")
    # E22-E23: the symbol tables and the sh_info fields
    symtabs = [i for i in range(e_shnum) if raw[i][1] == SHT_SYMTAB]
    if len(symtabs) > 1:
        raise section(f"{len(symtabs)} symbol tables")
    merc_symtabs = [i for i in range(e_shnum) if raw[i][1] == SHT_CUDA_MERC_SYMTAB]
    if len(merc_symtabs) > 1:
        raise section(f"{len(merc_symtabs)} Mercury symbol tables")
    nsyms = raw[symtabs[0]][5] // SYM_SIZE if symtabs else 0
    merc_nsyms = raw[merc_symtabs[0]][5] // SYM_SIZE if merc_symtabs else 0
    for i in range(1, e_shnum):
        typ, flags, info = raw[i][1], raw[i][2], raw[i][7]
        if typ == SHT_SYMTAB:
            ok = info <= nsyms
        elif typ == SHT_CUDA_MERC_SYMTAB:
            ok = info <= merc_nsyms
        elif typ in (SHT_REL, SHT_RELA, SHT_CUDA_MERC_RELA) or flags & SHF_INFO_LINK:
            ok = 1 <= info < e_shnum
        elif typ == SHT_PROGBITS and flags & SHF_EXECINSTR:
            # the function's symbol in the low 24 bits; ptxas puts the register count of an
            # sm_80 kernel in the high byte (0x28000009: 40 registers, symbol 9)
            ok = info & 0xFFFFFF < max(nsyms, 1)
        elif typ == SHT_CUDA_CAPMERC:
            ok = info < merc_nsyms  # its function's Mercury symbol
        else:
            ok = info == 0
        if not ok:
            raise section(f"section {i} (type {typ:#x}) has sh_info {info}")

    def name_at(table: Tuple, off: int) -> str:
        start = table[4] + off
        return data[start:data.index(b"\0", start)].decode("utf-8", "backslashreplace")

    sections = tuple(Section(i, name_at(shstr, s[0]), s[1], s[2], s[4], s[5], s[6], s[7],
                             s[8], s[9]) for i, s in enumerate(raw))
    # E24: symbols, then the Mercury symbols. A capmerc section's sh_info names the function
    # whose Mercury code it holds, at its start; that function's size is the size of the code
    # the driver finalizes from it (the offsets of its relocations and attributes lie below it).
    merc_code_size: Dict[int, int] = {}
    if merc_symtabs:
        mst = raw[merc_symtabs[0]]
        for i in range(1, e_shnum):
            if raw[i][1] != SHT_CUDA_CAPMERC:
                continue
            _n, st_info, _o, st_shndx, st_value, st_size = _SYM.unpack_from(
                data, mst[4] + raw[i][7] * SYM_SIZE)
            if st_info & 0xF != STT_FUNC or st_shndx != i or st_value:
                raise section(f"Mercury code section {i} names symbol {raw[i][7]}, not a "
                              "function at its start")
            merc_code_size[i] = st_size

    def read_symbols(table_index: int, count: int, what: str) -> List[Symbol]:
        st = raw[table_index]
        strtab = raw[st[6]]
        out: List[Symbol] = []
        for j in range(count):
            st_name, st_info, st_other, st_shndx, st_value, st_size = _SYM.unpack_from(
                data, st[4] + j * SYM_SIZE)
            if st_name >= strtab[5]:
                raise section(f"{what} {j}'s name at {st_name} is outside its string table "
                              f"({strtab[5]} bytes)")
            if e_shnum <= st_shndx < SHN_LORESERVE:
                raise section(f"{what} {j} is in section {st_shndx}, out of range")
            stype = st_info & 0xF
            if stype == STT_SECTION and (st_value or st_size):
                raise section(f"section {what} {j} has value {st_value:#x} and size {st_size} "
                              "(0 and 0)")
            if stype in (STT_FUNC, STT_OBJECT) and 0 < st_shndx < e_shnum:
                room = merc_code_size.get(st_shndx, raw[st_shndx][5])
                if st_value + st_size > room:
                    raise section(f"{what} {j} ends at {st_value + st_size}, past its section "
                                  f"({room} bytes)")
            out.append(Symbol(name_at(strtab, st_name), st_value, st_size, stype,
                              st_info >> 4, st_other, st_shndx))
        return out

    symbols = read_symbols(symtabs[0], nsyms, "symbol") if symtabs else []
    merc_symbols = (read_symbols(merc_symtabs[0], merc_nsyms, "Mercury symbol")
                    if merc_symtabs else [])

    def mercury(i: int) -> bool:
        return bool(raw[i][2] & SHF_CUDA_MERCURY)

    # E25: relocations (a Mercury one relocates Mercury code or data, by Mercury symbols)
    for i in range(1, e_shnum):
        typ, off, size, info = raw[i][1], raw[i][4], raw[i][5], raw[i][7]
        if typ not in (SHT_REL, SHT_RELA, SHT_CUDA_MERC_RELA):
            continue
        if mercury(i) != mercury(info):
            raise section(f"relocation section {i} and the section it relocates ({info}) are not "
                          "both of the Mercury copy or both not")
        ent = REL_SIZE if typ == SHT_REL else RELA_SIZE
        n_ok = merc_nsyms if typ == SHT_CUDA_MERC_RELA else nsyms
        target_size = merc_code_size.get(info, raw[info][5])
        for k in range(size // ent):
            r_offset, r_info = struct.unpack_from("<QQ", data, off + k * ent)
            if r_info >> 32 >= n_ok:
                raise section(f"relocation {k} of section {i} names symbol {r_info >> 32} of "
                              f"{n_ok}")
            if r_offset >= target_size:
                raise section(f"relocation {k} of section {i} is at {r_offset}, past section "
                              f"{info} ({target_size} bytes)")
    # E26: .nv.info records (a Mercury one describes Mercury code, by Mercury symbols)
    function_info: Dict[int, List[FunctionInfo]] = {}
    merc_function_info: Dict[int, List[FunctionInfo]] = {}
    module_info: List[FunctionInfo] = []  # the module-wide (not info-link) ones
    merc_module_info: List[FunctionInfo] = []
    for i in range(1, e_shnum):
        typ, flags, off, size, info = raw[i][1], raw[i][2], raw[i][4], raw[i][5], raw[i][7]
        if typ not in (SHT_CUDA_INFO, SHT_CUDA_MERC_INFO):
            continue
        merc = typ == SHT_CUDA_MERC_INFO
        code_size = None
        if flags & SHF_INFO_LINK:
            target = raw[info]
            if merc and target[1] != SHT_CUDA_CAPMERC:
                raise section(f".nv.info section {i} describes section {info}, which holds no "
                              "Mercury code")
            if not merc and (target[1] != SHT_PROGBITS or not target[2] & SHF_EXECINSTR):
                raise section(f".nv.info section {i} describes section {info}, which holds no "
                              "code")
            code_size = merc_code_size[info] if merc else target[5]
        fi = _read_nvinfo(data[off:off + size], i, merc_nsyms if merc else nsyms, code_size,
                          per_function=bool(flags & SHF_INFO_LINK))
        if flags & SHF_INFO_LINK:
            (merc_function_info if merc else function_info).setdefault(info, []).append(fi)
        else:
            (merc_module_info if merc else module_info).append(fi)
    # E27: the call graphs
    for i in range(1, e_shnum):
        typ, off, size = raw[i][1], raw[i][4], raw[i][5]
        if typ not in (SHT_CUDA_CALLGRAPH, SHT_CUDA_MERC_CALLGRAPH):
            continue
        n_ok = merc_nsyms if typ == SHT_CUDA_MERC_CALLGRAPH else nsyms
        if size % 8:
            raise section(f"call graph section {i} is {size} bytes, not pairs of 4-byte words")
        for k in range(size // 4):
            (w,) = struct.unpack_from("<I", data, off + 4 * k)
            if w >= n_ok and w < CALLGRAPH_MARKERS:
                raise section(f"call graph section {i} names symbol {w} of {n_ok}")
    # E28: notes
    for i in range(1, e_shnum):
        if raw[i][1] == SHT_NOTE:
            _check_notes(data[raw[i][4]:raw[i][4] + raw[i][5]], i)
    # E29: .nv.compat records
    for i in range(1, e_shnum):
        if raw[i][1] == SHT_CUDA_COMPAT:
            _check_compat(data[raw[i][4]:raw[i][4] + raw[i][5]], i)
    # E30: each kernel (a global function marked as an entry, defined in code; in the Mercury
    # symbol table, in Mercury code): the module-wide .nv.info records of it at least once each, and each
    # .nv.info describing its code one EIATTR_PARAM_CBANK, naming a .nv.constant0 section
    for merc, syms, modules, per_function in (
            (False, symbols, module_info, function_info),
            (True, merc_symbols, merc_module_info, merc_function_info)):
        what = "Mercury kernel" if merc else "kernel"
        for j, s in enumerate(syms):
            if not (s.type == STT_FUNC and s.bind == STB_GLOBAL and s.other & STO_CUDA_ENTRY
                    and 0 < s.shndx < e_shnum):
                continue
            code = raw[s.shndx]
            if merc and code[1] != SHT_CUDA_CAPMERC or not merc and (
                    code[1] != SHT_PROGBITS or not code[2] & SHF_EXECINSTR):
                continue
            for attr, attr_name in KERNEL_MODULE_ATTRS:
                count = sum(1 for fi in modules for a, sym in fi.symbol_values
                            if a == attr and sym == j)
                # ptxas of CUDA 12.4 and older (Triton 3.0-3.3) writes MIN_STACK_SIZE twice
                if count == 0:
                    raise section(f"{what} {s.name!r} (symbol {j}) has no {attr_name} record "
                                  f"(attribute {attr:#x}) in the module-wide .nv.info")
            if merc:
                continue
            for fi in per_function.get(s.shndx, ()):
                if fi.param_cbank_count != 1:
                    raise section(f"{what} {s.name!r} has {fi.param_cbank_count} "
                                  "EIATTR_PARAM_CBANK records (attribute 0xa) in the .nv.info "
                                  "of its code, not 1")
                bank = syms[fi.param_cbank[0]]
                if bank.type != STT_SECTION or not 0 < bank.shndx < e_shnum or \
                        not sections[bank.shndx].name.startswith(PARAM_BANK_PREFIX):
                    raise section(f"{what} {s.name!r}'s EIATTR_PARAM_CBANK names symbol "
                                  f"{fi.param_cbank[0]}, not the section symbol of a "
                                  f"{PARAM_BANK_PREFIX}* section")
    return CubinInfo(size=n, elf_abi_version=abi, e_flags=e_flags,
                     arch=arch_from_flags(abi, e_flags), sections=sections,
                     symbols=tuple(symbols),
                     function_info={k: tuple(v) for k, v in function_info.items()},
                     merc_symbols=tuple(merc_symbols),
                     merc_function_info={k: tuple(v) for k, v in merc_function_info.items()})


def _check_notes(blob: bytes, index: int) -> None:
    """E28: a note section is whole records (12-byte header, the owner, the description, each
    padded to 4 bytes) of ptxas's two kinds."""
    def bad(msg: str) -> CubinError:
        return CubinError("elf_section", f"note section {index}: {msg}")

    p = 0
    while p < len(blob):
        if p + 12 > len(blob):
            raise bad(f"a note at {p} is cut short")
        namesz, descsz, ntype = struct.unpack_from("<III", blob, p)
        name_at = p + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        end = desc_at + (descsz + 3) // 4 * 4
        if end > len(blob):
            raise bad(f"the note at {p} ({namesz} + {descsz} bytes) is cut short")
        if blob[name_at:name_at + namesz] != NOTE_OWNER:
            raise bad(f"the note at {p} is not NVIDIA's (its owner is {namesz} bytes)")
        desc = blob[desc_at:desc_at + descsz]
        if ntype == NT_CUDA_VERSION:
            if descsz not in CUDA_VERSION_NOTE_SIZES:
                raise bad(f"the CUDA version note at {p} is {descsz} bytes")
        elif ntype == NT_CUDA_TOOLKIT_INFO:
            strings = descsz - TOOLKIT_INFO_HEADER
            if strings <= 0 or desc[-1] != 0 or any(
                    o >= strings for o in struct.unpack_from("<5I", desc, 4)):
                raise bad(f"the toolkit note at {p} ({descsz} bytes) has strings out of bounds")
        else:
            raise bad(f"the note at {p} has type {ntype}")
        p = end


def _eiattr_records(blob: bytes, bad) -> Iterator[Tuple[int, int, bytes]]:
    """(format, attribute, value) of each record of an .nv.info or .nv.compat section, each
    whole (E29): a value is the 2 bytes of the header (NVAL, BVAL, HVAL) or the SVAL's payload.
    ``bad(msg)`` makes the error, which names the record's offset."""
    p = 0
    while p < len(blob):
        if p + 4 > len(blob):
            raise bad(f"a record at {p} is cut short")
        fmt, attr = blob[p], blob[p + 1]
        if fmt == EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", blob, p + 2)
            if p + 4 + size > len(blob):
                raise bad(f"attribute {attr:#x} at {p} of {size} bytes is cut short")
            val, nxt = blob[p + 4:p + 4 + size], p + 4 + size
        elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            val, nxt = blob[p + 2:p + 4], p + 4
        else:
            raise bad(f"attribute {attr:#x} at {p} has format {fmt}")
        yield fmt, attr, val
        p = nxt


def _check_compat(blob: bytes, index: int) -> None:
    """E29: .nv.compat holds whole records of a known format, each attribute once."""
    def bad(msg: str) -> CubinError:
        return CubinError("elf_section", f".nv.compat section {index}: {msg}")

    seen = set()
    for _, attr, _ in _eiattr_records(blob, bad):
        if attr not in COMPAT_ATTRS or attr in seen:
            raise bad(f"attribute {attr:#x} is unknown or repeated")
        seen.add(attr)


def _read_nvinfo(blob: bytes, index: int, nsyms: int, code_size: Optional[int],
                 per_function: bool) -> FunctionInfo:
    def bad(msg: str) -> CubinError:
        return CubinError("elf_section", f".nv.info section {index}: {msg}")

    params: List[KernelParam] = []
    cbank_param_size = param_cbank = reqntid = max_threads = None
    param_cbank_count = 0
    symbol_values: List[Tuple[int, int]] = []
    for fmt, attr, val in _eiattr_records(blob, bad):
        if attr not in KNOWN_ATTRS:
            raise bad(f"attribute {attr:#x} is not one this reader knows")
        if not per_function and fmt == EIFMT_SVAL:
            # the module-wide .nv.info: each record is about a function, its symbol first
            if len(val) < 4 or struct.unpack_from("<I", val, 0)[0] >= nsyms:
                raise bad(f"attribute {attr:#x} does not name a symbol of {nsyms}")

        def need(sval_size: Optional[int], what: str) -> None:
            if fmt != EIFMT_SVAL or (sval_size is not None and len(val) != sval_size):
                raise bad(f"{what} (attribute {attr:#x}) has format {fmt} and {len(val)} bytes")

        if attr in SYMBOL_VALUE_ATTRS:
            need(8, "a per-function value")
            (sym,) = struct.unpack_from("<I", val, 0)
            if sym >= nsyms:
                raise bad(f"attribute {attr:#x} names symbol {sym} of {nsyms}")
            symbol_values.append((attr, sym))
        elif attr == EIATTR_KPARAM_INFO:
            need(12, "a parameter record")
            _index, ordinal, offset, flags = struct.unpack_from("<IHHI", val, 0)
            params.append(KernelParam(ordinal=ordinal, offset=offset, size=(flags >> 18) & 0x3FFF))
        elif attr == EIATTR_CBANK_PARAM_SIZE:
            if fmt != EIFMT_HVAL:
                raise bad(f"the parameter bank size (attribute {attr:#x}) has format {fmt}")
            (cbank_param_size,) = struct.unpack("<H", val)
        elif attr == EIATTR_PARAM_CBANK:
            need(8, "the parameter bank")
            sym, word = struct.unpack_from("<II", val, 0)
            if sym >= nsyms:
                raise bad(f"the parameter bank names symbol {sym} of {nsyms}")
            param_cbank = (sym, word & 0xFFFF, word >> 16)
            param_cbank_count += 1
        elif attr == EIATTR_EXTERNS:
            need(None, "external symbols")
            if len(val) % 4 or any(x >= nsyms for (x,) in struct.iter_unpack("<I", val)):
                raise bad(f"external symbols (attribute {attr:#x}) name symbols out of range")
        elif attr in (EIATTR_REQNTID, EIATTR_MAX_THREADS):
            need(12, "a block size")
            dims = struct.unpack_from("<III", val, 0)
            if attr == EIATTR_REQNTID:
                reqntid = dims
            else:
                max_threads = dims
        elif attr in INSTR_OFFSET_ATTRS:
            need(None, "instruction offsets")
            if len(val) % 4:
                raise bad(f"instruction offsets (attribute {attr:#x}) of {len(val)} bytes")
            for (o,) in struct.iter_unpack("<I", val):
                if code_size is None or o >= code_size:
                    raise bad(f"instruction offset {o} (attribute {attr:#x}) outside the code "
                              f"({code_size} bytes)")
        elif attr in UNNAMED_ATTR_FORMATS:
            want_fmt, want_size = UNNAMED_ATTR_FORMATS[attr]
            if fmt != want_fmt or (want_size is not None and len(val) != want_size):
                raise bad(f"attribute {attr:#x} has format {fmt} and {len(val)} bytes")
    return FunctionInfo(params=tuple(params), cbank_param_size=cbank_param_size,
                        param_cbank=param_cbank, reqntid=reqntid, max_threads=max_threads,
                        param_cbank_count=param_cbank_count, symbol_values=tuple(symbol_values))


def has_symbol(data: bytes, name: str) -> bool:
    """Whether ``name`` is a global function symbol of the (well-formed) cubin ``data``."""
    try:
        return bool(parse_cubin(data).entry_symbols(name))
    except CubinError:
        return False

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

The C++ loader has the same reader (optimizer/luminav-triton-aot/src/aot/elf.cpp and
elf_records.cpp); the shared corpus under tests/data/bundles holds cubins both must refuse with
the same code.
"""
from __future__ import annotations

import struct
from typing import Dict, List, Tuple

from .cubin_format import (  # noqa: F401  (with the reader's types, also under this module's name)
    ALLOWED_SECTION_FLAGS, ALLOWED_SECTION_TYPES, CALLGRAPH_MARKERS, CubinError, CubinInfo,
    EHDR_SIZE, EIATTR_KPARAM_INFO, EIATTR_PARAM_CBANK, EIATTR_REQNTID, ELF_ABI_VERSIONS,
    ELF_MAGIC, EM_CUDA, ENTSIZE_WRITTEN, ET_EXEC, FunctionInfo, KERNEL_MODULE_ATTRS, KernelParam,
    MERCURY_TYPES, MERCURY_VIEW_TYPES, PARAM_BANK_PREFIX, PHDR_SIZE, PT_LOAD, PT_PHDR, RELA_SIZE,
    REL_SIZE, SHDR_SIZE, SHF_ALLOC, SHF_CUDA_MERCURY, SHF_EXECINSTR, SHF_INFO_LINK, SHF_NOTE_BITS,
    SHN_LORESERVE, SHT_CUDA_CALLGRAPH, SHT_CUDA_CAPMERC, SHT_CUDA_COMPAT, SHT_CUDA_INFO,
    SHT_CUDA_MERC_CALLGRAPH, SHT_CUDA_MERC_INFO, SHT_CUDA_MERC_RELA, SHT_CUDA_MERC_SYMTAB,
    SHT_CUDA_RELOCINFO, SHT_NOBITS, SHT_NOTE, SHT_NULL, SHT_PROGBITS, SHT_REL, SHT_RELA,
    SHT_STRTAB, SHT_SYMTAB, STB_GLOBAL, STO_CUDA_ENTRY, STT_FUNC, STT_OBJECT, STT_SECTION,
    SYM_SIZE, Section, Symbol, _EHDR, _PHDR, _SHDR, _SYM,
)
from .cubin_records import (  # noqa: F401  (the record readers)
    _check_compat, _check_notes, _eiattr_records, _read_nvinfo,
)


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


def has_symbol(data: bytes, name: str) -> bool:
    """Whether ``name`` is a global function symbol of the (well-formed) cubin ``data``."""
    try:
        return bool(parse_cubin(data).entry_symbols(name))
    except CubinError:
        return False

"""Just enough of the cubin (CUDA ELF) format to check a bundle without a GPU.

A cubin is an ELF64 little-endian file. ``verify`` reads from it what the driver would find
at load: that the file is whole (the section header table lies inside it), the SM arch in
``e_flags``, the symbol names, and for each kernel the ``.nv.info.<entry>`` attributes, whose
``EIATTR_KPARAM_INFO`` records are the kernel's own parameters (the same list
``cuFuncGetParamInfo`` reports) with their ordinal, offset and size.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

ELF_MAGIC = b"\x7fELF"
_ELFCLASS64 = 2
_ELFDATA2LSB = 1
_EHDR = struct.Struct("<HHIQQQIHHHHHH")  # from offset 16
_SHDR = struct.Struct("<IIQQQQIIQQ")
_PHDR = struct.Struct("<IIQQQQQQ")
EM_CUDA = 190

# nvinfo attribute formats and the ids read here (from the CUDA ELF "EIATTR" list)
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19


class CubinError(ValueError):
    """The bytes are not a whole, well-formed cubin."""


@dataclass(frozen=True)
class KernelParam:
    ordinal: int
    offset: int
    size: int


@dataclass(frozen=True)
class CubinInfo:
    size: int
    elf_abi_version: int
    e_flags: int
    arch: Optional[int]  # SM arch (e.g. 90) where the e_flags layout is known, else None
    sections: Tuple[str, ...]
    # entry name -> its parameters in ordinal order (from .nv.info.<entry>)
    params: Dict[str, Tuple[KernelParam, ...]]
    # entry name -> total parameter bytes (EIATTR_CBANK_PARAM_SIZE), where present
    param_bytes: Dict[str, int]


def _arch_from_flags(abi_version: int, e_flags: int) -> Optional[int]:
    # ELF ABI version 7 (CUDA 11 - 12.x, what Triton's ptxas writes): the SM number is the
    # low byte of e_flags (0x5a = 90). Other layouts are not decoded.
    if abi_version == 7:
        return e_flags & 0xFF
    # ELF ABI version 8 (the ptxas of CUDA 12.8 and later, e.g. in Triton 3.9): the SM arch
    # moved to the second byte (0x5a04: sm_90).
    if abi_version == 8:
        return (e_flags >> 8) & 0xFF
    return None


def parse_cubin(data: bytes) -> CubinInfo:
    """Check that ``data`` is a whole cubin and read what verification needs."""
    n = len(data)
    if n < 64:
        raise CubinError(f"{n} bytes is too short for an ELF64 header (64 bytes): truncated")
    if data[:4] != ELF_MAGIC:
        raise CubinError(f"does not start with the ELF magic 7f 45 4c 46 (found {data[:4].hex(' ')})")
    if data[4] != _ELFCLASS64 or data[5] != _ELFDATA2LSB:
        raise CubinError(f"not a little-endian ELF64 file (class {data[4]}, data {data[5]})")
    (_e_type, e_machine, _e_version, _e_entry, e_phoff, e_shoff, e_flags, _e_ehsize,
     e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx) = _EHDR.unpack_from(data, 16)
    if e_machine != EM_CUDA:
        raise CubinError(f"ELF machine is {e_machine}, not CUDA ({EM_CUDA})")
    if e_shentsize != _SHDR.size or e_shnum == 0:
        raise CubinError(f"bad section header table (entry size {e_shentsize}, count {e_shnum})")
    end = e_shoff + e_shnum * e_shentsize
    if end > n:
        raise CubinError(f"the section header table ends at byte {end} but the file has {n}: "
                         "truncated")
    if e_phnum:
        if e_phentsize != _PHDR.size:
            raise CubinError(f"bad program header table (entry size {e_phentsize})")
        pend = e_phoff + e_phnum * e_phentsize
        if pend > n:
            raise CubinError(f"the program header table ends at byte {pend} but the file has "
                             f"{n}: truncated")
        for i in range(e_phnum):
            _pt, _pf, p_offset, _va, _pa, p_filesz, _memsz, _al = _PHDR.unpack_from(
                data, e_phoff + i * e_phentsize)
            if p_offset + p_filesz > n:
                raise CubinError(f"segment {i} ends at byte {p_offset + p_filesz} but the file "
                                 f"has {n}: truncated")
    shdrs = [_SHDR.unpack_from(data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    for i, sh in enumerate(shdrs):
        sh_type, sh_offset, sh_size = sh[1], sh[4], sh[5]
        if sh_type != 8 and sh_offset + sh_size > n:  # 8 = SHT_NOBITS occupies no file bytes
            raise CubinError(f"section {i} ends at byte {sh_offset + sh_size} but the file has "
                             f"{n}: truncated")
    if e_shstrndx >= e_shnum:
        raise CubinError(f"section name table index {e_shstrndx} out of range ({e_shnum})")
    strtab = shdrs[e_shstrndx]

    def name_of(off: int) -> str:
        start = strtab[4] + off
        stop = data.find(b"\0", start, strtab[4] + strtab[5])
        if stop < 0:
            raise CubinError("unterminated section name")
        return data[start:stop].decode("ascii", "replace")

    names = tuple(name_of(sh[0]) for sh in shdrs)
    params: Dict[str, Tuple[KernelParam, ...]] = {}
    param_bytes: Dict[str, int] = {}
    for name, sh in zip(names, shdrs):
        if name.startswith(".nv.info."):
            entry = name[len(".nv.info."):]
            plist, pbytes = _read_nvinfo(data[sh[4]:sh[4] + sh[5]])
            params[entry] = tuple(sorted(plist, key=lambda p: p.ordinal))
            if pbytes is not None:
                param_bytes[entry] = pbytes
    abi = data[8]
    return CubinInfo(size=n, elf_abi_version=abi, e_flags=e_flags,
                     arch=_arch_from_flags(abi, e_flags), sections=names, params=params,
                     param_bytes=param_bytes)


def _read_nvinfo(blob: bytes) -> Tuple[List[KernelParam], Optional[int]]:
    out: List[KernelParam] = []
    total: Optional[int] = None
    p = 0
    while p + 2 <= len(blob):
        fmt, attr = blob[p], blob[p + 1]
        p += 2
        if fmt == _EIFMT_SVAL:
            if p + 2 > len(blob):
                raise CubinError("truncated .nv.info attribute")
            (size,) = struct.unpack_from("<H", blob, p)
            p += 2
            val = blob[p:p + size]
            if len(val) != size:
                raise CubinError("truncated .nv.info attribute")
            p += size
        elif fmt in (_EIFMT_HVAL, _EIFMT_BVAL, _EIFMT_NVAL):
            # every record header is 4 bytes: format, attribute, then a 2-byte field that
            # holds the value (HVAL), the value and a pad byte (BVAL), or nothing (NVAL)
            if p + 2 > len(blob):
                raise CubinError("truncated .nv.info attribute")
            val = blob[p:p + (2 if fmt == _EIFMT_HVAL else 1 if fmt == _EIFMT_BVAL else 0)]
            p += 2
        else:
            raise CubinError(f"unknown .nv.info attribute format {fmt}")
        if attr == EIATTR_KPARAM_INFO and len(val) >= 12:
            _index, ordinal, offset, flags = struct.unpack_from("<IHHI", val, 0)
            out.append(KernelParam(ordinal=ordinal, offset=offset, size=(flags >> 18) & 0x3FFF))
        elif attr == EIATTR_CBANK_PARAM_SIZE and len(val) == 2:
            (total,) = struct.unpack("<H", val)
    return out, total


def has_symbol(data: bytes, name: str) -> bool:
    """Whether ``name`` appears as a NUL-terminated string in the cubin (its symbol tables)."""
    return (b"\0" + name.encode() + b"\0") in data

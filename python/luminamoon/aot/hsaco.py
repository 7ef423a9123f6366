"""AMDGPU code objects (``.hsaco``): the bundle rule book's H rules (docs/bundle-format.md, "H:
each hsaco"), the twin of :mod:`.cubin` for HIP entries.

A code object is an ELF64 shared object (EM_AMDGPU, ELFOSABI_AMDGPU_HSA) whose
``NT_AMDGPU_METADATA`` note (owner ``AMDGPU``, type 32) is msgpack: ``amdhsa.kernels[i]`` with
``.name``, ``.args`` (``.offset``, ``.size``, ``.value_kind``), ``.wavefront_size`` and
``.max_flat_workgroup_size``. The note is decoded with msgpack-python; nothing here decodes
msgpack by hand. The gfx arch is ``e_flags & 0xff``.

:func:`parse_hsaco` checks the structure (H2) and the note's shape (H3) and raises
:class:`HsacoError` with the rule's code; :func:`check_hsaco` runs H1-H9 for one manifest entry
and raises :class:`~.rules.BundleError`.
"""
from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .files import read_code_object
from .rules import BundleError

# target.arch -> EF_AMDGPU_MACH (e_flags & 0xff), the archs a HIP entry may name
GFX_MACH: Dict[str, int] = {"gfx90a": 0x3F, "gfx942": 0x4C, "gfx950": 0x4F}
HIP_ARCHS: Tuple[str, ...] = tuple(GFX_MACH)
HIP_WARP_SIZE = 64

EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
ABI_VERSIONS = (2, 3, 4)  # code object v4, v5, v6
ET_DYN = 3
SHT_SYMTAB, SHT_STRTAB, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 2, 3, 7, 8, 11
STB_GLOBAL, STT_OBJECT = 1, 1
NT_AMDGPU_METADATA = 32
NOTE_OWNER = b"AMDGPU\x00"
MSGPACK_MAX_DEPTH = 16
_FIX_REBUILD = "rebuild the bundle (luminamoon aot build)"


class HsacoError(ValueError):
    """A code object that breaks rule H2 or H3; ``code`` is the rule book's code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Symbol:
    name: str
    bind: int
    type: int
    shndx: int


@dataclass(frozen=True)
class HsacoInfo:
    mach: int  # e_flags & 0xff
    abi_version: int
    shnum: int
    dynsym: Tuple[Symbol, ...]
    kernels: Tuple[Dict[str, Any], ...]  # amdhsa.kernels of the metadata note
    metadata: Dict[str, Any]

    def kernel(self, name: str) -> List[Dict[str, Any]]:
        return [k for k in self.kernels if k.get(".name") == name]


def arch_of_mach(mach: int) -> str:
    for arch, m in GFX_MACH.items():
        if m == mach:
            return arch
    return f"an unknown gfx arch (EF_AMDGPU_MACH 0x{mach:02x})"


def explicit_args(kernel: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The arguments a launcher packs: those whose ``.value_kind`` is not ``hidden_*``."""
    return [a for a in kernel.get(".args", []) if not a[".value_kind"].startswith("hidden_")]


# --------------------------------------------------------------------------------------------
# H2: the ELF structure
# --------------------------------------------------------------------------------------------
def _header(data: bytes) -> Tuple[int, ...]:
    if len(data) < 64:
        raise HsacoError("truncated", f"{len(data)} bytes, shorter than an ELF64 header (64)")
    ident = data[:16]
    (e_type, e_machine, e_version, _entry, e_phoff, e_shoff, e_flags, e_ehsize, e_phentsize,
     e_phnum, e_shentsize, e_shnum, e_shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", data, 16)
    checks = (
        (ident[:4] == b"\x7fELF", "the ELF magic", ident[:4].hex()),
        (ident[4] == 2, "ELFCLASS64 (2)", ident[4]),
        (ident[5] == 1, "little-endian (1)", ident[5]),
        (ident[6] == 1, "EI_VERSION 1", ident[6]),
        (ident[7] == ELFOSABI_AMDGPU_HSA, "EI_OSABI 64 (AMDGPU HSA)", ident[7]),
        (ident[8] in ABI_VERSIONS, "EI_ABIVERSION 2, 3 or 4 (code object v4-v6)", ident[8]),
        (e_type == ET_DYN, "e_type ET_DYN (3)", e_type),
        (e_machine == EM_AMDGPU, "e_machine EM_AMDGPU (224)", e_machine),
        (e_version == 1, "e_version 1", e_version),
        (e_ehsize == 64, "e_ehsize 64", e_ehsize),
        (e_shentsize == 64, "e_shentsize 64", e_shentsize),
        (1 <= e_shnum <= 0xFEFF, "e_shnum 1..0xfeff", e_shnum),
        (1 <= e_shstrndx < max(e_shnum, 1), "e_shstrndx 1..e_shnum-1", e_shstrndx),
        (e_phnum == 0 or e_phentsize == 56, "program headers of 56 bytes", e_phentsize),
    )
    for ok, want, got in checks:
        if not ok:
            raise HsacoError("elf_header", f"not an AMDGPU code object: expected {want}, "
                             f"found {got}")
    return e_phoff, e_shoff, e_flags, e_phnum, e_shnum, e_shstrndx, ident[8]


def _is_strtab(data: bytes, sec: Tuple[int, ...]) -> bool:
    _name, typ, _flags, off, size, _link = sec
    return typ == SHT_STRTAB and size > 0 and data[off] == 0 and data[off + size - 1] == 0


def _cstr(data: bytes, base: int, size: int, at: int, what: str) -> str:
    if at >= size:
        raise HsacoError("elf_section", f"{what} at {at} lies outside its string table "
                         f"({size} bytes)")
    end = data.index(b"\x00", base + at)
    return data[base + at:end].decode("utf-8", "replace")


def _notes(data: bytes, off: int, size: int, index: int) -> List[Tuple[bytes, int, bytes]]:
    out, p, end = [], off, off + size
    while p < end:
        if end - p < 12:
            raise HsacoError("elf_section", f"section {index}: a note header cut short")
        namesz, descsz, ntype = struct.unpack_from("<III", data, p)
        name_end = p + 12 + namesz
        desc = p + 12 + (namesz + 3) // 4 * 4
        nxt = desc + (descsz + 3) // 4 * 4
        if nxt > end:
            raise HsacoError("elf_section", f"section {index}: a note of {namesz}+{descsz} bytes "
                             "reaches past its section")
        out.append((data[p + 12:name_end], ntype, data[desc:desc + descsz]))
        p = nxt
    return out


def parse_hsaco(data: bytes) -> HsacoInfo:
    """Rules H2 and H3 on a code object's bytes; raises :class:`HsacoError` (with ``code``)."""
    phoff, shoff, e_flags, phnum, shnum, shstrndx, abi = _header(data)
    n = len(data)
    if shoff + 64 * shnum > n:
        raise HsacoError("truncated", f"the section header table ({shnum} x 64 bytes at "
                         f"{shoff}) ends past the file ({n} bytes)")
    if phnum and phoff + 56 * phnum > n:
        raise HsacoError("truncated", f"the program header table ({phnum} x 56 bytes at "
                         f"{phoff}) ends past the file ({n} bytes)")
    secs = []
    for i in range(shnum):
        name, typ, flags, _addr, off, size, link, _info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + 64 * i)
        if typ != SHT_NOBITS and off + size > n:
            raise HsacoError("truncated", f"section {i} ({size} bytes at {off}) ends past the "
                             f"file ({n} bytes)")
        secs.append((name, typ, flags, off, size, link, entsize))
    names = secs[shstrndx]
    if not _is_strtab(data, names[:6]):
        raise HsacoError("elf_section", f"the section name table (section {shstrndx}) is not a "
                         "string table that begins and ends with NUL")
    for i, s in enumerate(secs):
        _cstr(data, names[3], names[4], s[0], f"section {i}'s name")
    dynsyms = [i for i, s in enumerate(secs) if s[1] == SHT_DYNSYM]
    if len(dynsyms) != 1:
        raise HsacoError("elf_section", f"{len(dynsyms)} .dynsym sections, expected one")
    tables: Dict[int, List[Symbol]] = {}
    for i, (_name, typ, _flags, off, size, link, entsize) in enumerate(secs):
        if typ not in (SHT_SYMTAB, SHT_DYNSYM):
            continue
        if entsize != 24 or size % 24:
            raise HsacoError("elf_section", f"symbol table {i}: entries of {entsize} bytes over "
                             f"{size} bytes, expected 24-byte entries tiling it")
        if not (0 < link < shnum and _is_strtab(data, secs[link][:6])):
            raise HsacoError("elf_section", f"symbol table {i} links section {link}, not a string "
                             "table that begins and ends with NUL")
        soff, ssize = secs[link][3], secs[link][4]
        syms = []
        for j in range(size // 24):
            st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, off + 24 * j)
            syms.append(Symbol(_cstr(data, soff, ssize, st_name, f"symbol {j} of table {i}"),
                               st_info >> 4, st_info & 0xF, st_shndx))
        tables[i] = syms
    found = []
    for i, s in enumerate(secs):
        if s[1] == SHT_NOTE:
            found += [d for owner, t, d in _notes(data, s[3], s[4], i)
                      if owner == NOTE_OWNER and t == NT_AMDGPU_METADATA]
    if len(found) != 1:
        raise HsacoError("hsaco_note", f"{len(found)} NT_AMDGPU_METADATA notes (owner AMDGPU, "
                         "type 32), expected one")
    metadata = decode_metadata(found[0])
    dynsym = tuple(tables[dynsyms[0]])
    return HsacoInfo(mach=e_flags & 0xFF, abi_version=abi, shnum=shnum, dynsym=dynsym,
                     kernels=tuple(metadata["amdhsa.kernels"]), metadata=metadata)


# --------------------------------------------------------------------------------------------
# H3: the metadata note
# --------------------------------------------------------------------------------------------
def _unique_keys(pairs: Sequence[Tuple[Any, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in pairs:
        if not isinstance(k, str):
            raise ValueError(f"a map key that is not a string: {k!r}")
        if k in out:
            raise ValueError(f"map key {k!r} twice")
        out[k] = v
    return out


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            if d <= MSGPACK_MAX_DEPTH:
                stack += [(c, d + 1) for c in (v.values() if isinstance(v, dict) else v)]
    return deepest


def _is_uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def decode_metadata(desc: bytes) -> Dict[str, Any]:
    """The NT_AMDGPU_METADATA description as a map, checked to rule H3's shape."""
    try:
        import msgpack
    except ImportError as exc:  # a dependency of the builder and the tests
        raise RuntimeError("reading an AMDGPU code object needs the msgpack package: pip install "
                           "msgpack (or luminamoon[triton])") from exc
    try:
        meta = msgpack.unpackb(desc, raw=False, strict_map_key=False,
                               object_pairs_hook=_unique_keys, use_list=True)
    except Exception as exc:  # noqa: BLE001 - every msgpack error is this refusal
        raise HsacoError("hsaco_note", f"the metadata note is not one msgpack value: "
                         f"{type(exc).__name__}: {exc}") from None
    if _depth(meta) > MSGPACK_MAX_DEPTH:
        raise HsacoError("hsaco_note", f"the metadata note nests deeper than {MSGPACK_MAX_DEPTH}")
    if not isinstance(meta, dict) or not isinstance(meta.get("amdhsa.kernels"), list):
        raise HsacoError("hsaco_note", "the metadata note is not a map with an amdhsa.kernels "
                         "array")
    for i, k in enumerate(meta["amdhsa.kernels"]):
        where = f"amdhsa.kernels[{i}]"
        if not isinstance(k, dict) or not isinstance(k.get(".name"), str):
            raise HsacoError("hsaco_note", f"{where} is not a map with a string .name")
        args = k.get(".args", [])
        if not isinstance(args, list):
            raise HsacoError("hsaco_note", f"{where}.args is not an array")
        for j, a in enumerate(args):
            if not (isinstance(a, dict) and isinstance(a.get(".value_kind"), str)
                    and _is_uint(a.get(".offset")) and _is_uint(a.get(".size"))):
                raise HsacoError("hsaco_note", f"{where}.args[{j}] is not a map with a string "
                                 ".value_kind and integer .offset and .size")
        for name in (".wavefront_size", ".max_flat_workgroup_size"):
            if name in k and not _is_uint(k[name]):
                raise HsacoError("hsaco_note", f"{where}.{name[1:]} is not an integer")
        if ".symbol" in k and not isinstance(k[".symbol"], str):
            raise HsacoError("hsaco_note", f"{where}.symbol is not a string")
    return meta


# --------------------------------------------------------------------------------------------
# H1-H9 for one manifest entry
# --------------------------------------------------------------------------------------------
def check_hsaco(bundle_dir: "os.PathLike[str] | str", entry: Mapping[str, Any], i: int,
                layout: List[Tuple[int, int]], data: Optional[bytes] = None) -> bytes:
    """Rules H1-H9 for the hsaco of ``kernels[i]``; ``layout`` is the (offset, size) of each
    parameter the manifest's signature and trailing pointers give. Returns the bytes."""
    p = f"kernels[{i}]"
    hpath, data = read_code_object(bundle_dir, entry, i, "hsaco", "an AMDGPU code object", data)
    try:
        info = parse_hsaco(data)
    except HsacoError as exc:
        raise BundleError(exc.code, hpath, f"{p}.hsaco", "a whole, well-formed AMDGPU code "
                          "object", str(exc), _FIX_REBUILD) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise BundleError("sha256", hpath, f"{p}.sha256", entry["sha256"], digest,
                          "the hsaco was changed or replaced; rebuild the bundle")
    name = entry["entry"]
    kernels = info.kernel(name)
    descriptor = f"{name}.kd"
    syms = [s for s in info.dynsym if s.name == descriptor and s.bind == STB_GLOBAL
            and s.type == STT_OBJECT and 0 < s.shndx < info.shnum]
    if len(kernels) != 1 or kernels[0].get(".symbol", descriptor) != descriptor or len(syms) != 1:
        have = [k[".name"] for k in info.kernels]
        raise BundleError("no_entry_symbol", hpath, f"{p}.entry",
                          f"one kernel {name!r} in the metadata note and one global object "
                          f"symbol {descriptor!r} in .dynsym",
                          f"kernels {have}, {len(syms)} such symbols", _FIX_REBUILD)
    kernel = kernels[0]
    arch = entry["target"]["arch"]
    if info.mach != GFX_MACH.get(arch):
        raise BundleError("arch", hpath, f"{p}.target.arch",
                          f"{arch_of_mach(info.mach)} (the code object's e_flags & 0xff = "
                          f"0x{info.mach:02x})", _show_arch(arch), _FIX_REBUILD)
    wave = kernel.get(".wavefront_size")
    if wave != entry["target"]["warp_size"]:
        raise BundleError("wavefront_size", hpath, f"{p}.target.warp_size",
                          f"{'none' if wave is None else wave} (the kernel's .wavefront_size)",
                          entry["target"]["warp_size"], _FIX_REBUILD)
    args = explicit_args(kernel)
    if len(args) != entry["num_params"]:
        raise BundleError("param_mismatch", hpath, f"{p}.num_params",
                          f"{len(args)} (the code object's explicit arguments of {name})",
                          entry["num_params"], _FIX_REBUILD)
    got = [(a[".offset"], a[".size"]) for a in args]
    if got != list(layout):
        raise BundleError("param_mismatch", hpath, f"{p}.signature",
                          f"arguments (offset, size) {got} (the code object's)",
                          f"{list(layout)} from the manifest", _FIX_REBUILD)
    threads = entry["num_warps"] * entry["target"]["warp_size"]
    most = kernel.get(".max_flat_workgroup_size")
    if most is not None and most < threads:
        raise BundleError("launch_shape", hpath, f"{p}.num_warps",
                          f"at most {most} threads (the kernel's .max_flat_workgroup_size)",
                          f"{threads} (num_warps {entry['num_warps']})", _FIX_REBUILD)
    return data


def _show_arch(arch: Any) -> str:
    return arch if isinstance(arch, str) else repr(arch)

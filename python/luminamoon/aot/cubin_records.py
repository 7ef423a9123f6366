"""aot/cubin_records.py: the readers of a cubin's record sections: its notes (.note.nv.*), the
.nv.compat records and a kernel's .nv.info attributes (docs/bundle-format.md, "Cubins"), as
aot/cubin.py's parse_cubin calls them; each raises CubinError naming the section.
"""
from __future__ import annotations

import struct
from typing import Iterator, List, Optional, Tuple

from .cubin_format import (
    COMPAT_ATTRS, CUDA_VERSION_NOTE_SIZES, CubinError, EIATTR_CBANK_PARAM_SIZE, EIATTR_EXTERNS,
    EIATTR_KPARAM_INFO, EIATTR_MAX_THREADS, EIATTR_PARAM_CBANK, EIATTR_REQNTID, EIFMT_BVAL,
    EIFMT_HVAL, EIFMT_NVAL, EIFMT_SVAL, FunctionInfo, INSTR_OFFSET_ATTRS, KNOWN_ATTRS,
    KernelParam, NOTE_OWNER, NT_CUDA_TOOLKIT_INFO, NT_CUDA_VERSION, SYMBOL_VALUE_ATTRS,
    TOOLKIT_INFO_HEADER, UNNAMED_ATTR_FORMATS,
)


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

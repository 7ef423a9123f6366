"""The corpus's HIP cases (make_corpus.py calls :func:`hip_cases`): bundles whose AMD code
objects (base/'s kernels[4], gfx942, and kernels[5], gfx90a) or HIP manifest entries break one
rule of docs/bundle-format.md ("H: each hsaco", ``hip_target``). Byte offsets are computed here
from the code object's ELF structure and its msgpack note, so each case reads as what it breaks.
"""
from __future__ import annotations

import json
import os
import struct

H4 = "commit.f1.T1024.w4.gfx942.hsaco"  # kernels[4]'s code object
H5 = "commit.f1.T1024.w4.gfx90a.hsaco"  # kernels[5]'s
SH_FIELDS = {"name": (0, 4), "type": (4, 4), "flags": (8, 8), "offset": (24, 8), "size": (32, 8),
             "link": (40, 4), "info": (44, 4), "align": (48, 8), "entsize": (56, 8)}


def le(v: int, n: int) -> str:
    return (v & ((1 << (8 * n)) - 1)).to_bytes(n, "little").hex()


class Hsaco:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.shoff = struct.unpack_from("<Q", data, 0x28)[0]
        shnum, shstrndx = struct.unpack_from("<HH", data, 0x3C)
        self.sections = [struct.unpack_from("<IIQQQQIIQQ", data, self.shoff + 64 * i)
                         for i in range(shnum)]
        names = self.sections[shstrndx]
        self.names = [data[names[4] + s[0]:data.index(b"\x00", names[4] + s[0])].decode()
                      for s in self.sections]

    def index(self, name: str) -> int:
        return self.names.index(name)

    def offset(self, name: str) -> int:
        return self.sections[self.index(name)][4]

    def size(self, name: str) -> int:
        return self.sections[self.index(name)][5]

    def sh(self, name: str, field: str, value: int) -> dict:
        off, n = SH_FIELDS[field]
        return {"op": "patch", "file": H4, "offset": self.shoff + 64 * self.index(name) + off,
                "hex": le(value, n)}

    def note(self) -> tuple:
        """(offset of the metadata note's header, offset of its description, its size)."""
        p = self.offset(".note")
        while True:
            namesz, descsz, ntype = struct.unpack_from("<III", self.data, p)
            desc = p + 12 + (namesz + 3) // 4 * 4
            if self.data[p + 12:p + 12 + namesz] == b"AMDGPU\x00" and ntype == 32:
                return p, desc, descsz
            p = desc + (descsz + 3) // 4 * 4

    def in_note(self, needle: bytes, first: bool = False) -> int:
        """The offset of ``needle`` in the metadata note: its only occurrence (or its first)."""
        _, desc, size = self.note()
        blob = self.data[desc:desc + size]
        assert blob.count(needle) == 1 or (first and needle in blob), needle
        return desc + blob.index(needle)


def hip_cases(base: str) -> list:
    man = json.load(open(os.path.join(base, "manifest.json")))
    e4 = man["kernels"][4]
    assert e4["hsaco"] == H4 and man["kernels"][5]["hsaco"] == H5
    h = Hsaco(open(os.path.join(base, H4), "rb").read())
    entry = e4["entry"]
    k4, f = "/kernels/4", "kernels[4]"
    F = "HIP: the AMDGPU code object and its metadata note"
    out = []

    def case(name, code, field, *ops):
        out.append({"name": name, "code": code, "field": field, "finding": F, "ops": list(ops)})

    def patch(offset, hexbytes, file=H4):
        return {"op": "patch", "file": file, "offset": offset, "hex": hexbytes}

    def jset(path, value):
        return {"op": "json", "path": path, "value": value}

    rehash = {"op": "rehash", "file": H4}
    note_hdr, note_desc, _ = h.note()

    # good bundles
    case("good-hip-only", None, None, *[{"op": "json", "path": f"/kernels/{i}", "remove": True}
                                        for i in (3, 2, 1, 0)])
    # the manifest (K1, K2: hip_target, key_mismatch, duplicate)
    case("hip-arch-unknown", "hip_target", f"{f}.target.arch", jset(k4 + "/target/arch", "gfx1100"))
    case("hip-arch-integer", "bad_type", f"{f}.target.arch", jset(k4 + "/target/arch", 942))
    case("hip-warp-size-32", "hip_target", f"{f}.target.warp_size",
         jset(k4 + "/target/warp_size", 32))
    case("hip-in-format-version-2", "hip_target", f"{f}.target.backend", jset("/format_version", 2))
    case("hip-entry-with-cubin-field", "missing_field", f"{f}.hsaco",
         jset(k4 + "/cubin", H4), {"op": "json", "path": k4 + "/hsaco", "remove": True})
    case("cuda-entry-marked-hip", "missing_field", "kernels[0].hsaco",
         jset("/kernels/0/target/backend", "hip"))
    case("hip-hsaco-with-directory", "bad_value", f"{f}.hsaco", jset(k4 + "/hsaco", "../" + H4))
    case("hip-hsaco-other-arch", "key_mismatch", f"{f}.hsaco", jset(k4 + "/hsaco", H5))
    case("hip-duplicate", "duplicate", "kernels[5]", jset("/kernels/5", e4))
    # files (H1)
    case("hsaco-missing", "missing_file", f"{f}.hsaco", {"op": "remove", "file": H4})
    case("hsaco-fifo", "not_regular_file", f"{f}.hsaco", {"op": "remove", "file": H4},
         {"op": "mkfifo", "file": H4})
    case("hsaco-too-large", "too_large", f"{f}.hsaco",
         {"op": "truncate", "file": H4, "size": (64 << 20) + 1})
    case("hsaco-empty", "truncated", f"{f}.hsaco", {"op": "truncate", "file": H4, "size": 0})
    # the ELF structure (H2)
    case("hsaco-cut-header", "truncated", f"{f}.hsaco", {"op": "truncate", "file": H4, "size": 40})
    case("hsaco-cut-section-table", "truncated", f"{f}.hsaco",
         {"op": "truncate", "file": H4, "size": h.shoff + 100})
    case("hsaco-section-past-end", "truncated", f"{f}.hsaco",
         h.sh(".text", "size", len(h.data)))
    case("hsaco-elf32", "elf_header", f"{f}.hsaco", patch(4, "01"))
    case("hsaco-osabi-0", "elf_header", f"{f}.hsaco", patch(7, "00"))
    case("hsaco-abi-version-1", "elf_header", f"{f}.hsaco", patch(8, "01"))
    case("hsaco-exec", "elf_header", f"{f}.hsaco", patch(16, le(2, 2)))
    case("hsaco-machine-cuda", "elf_header", f"{f}.hsaco", patch(18, le(190, 2)))
    case("hsaco-shstrndx-0", "elf_header", f"{f}.hsaco", patch(62, le(0, 2)))
    shstr_end = h.offset(".shstrtab") + h.size(".shstrtab") - 1
    case("hsaco-names-not-nul-terminated", "elf_section", f"{f}.hsaco", patch(shstr_end, "78"))
    case("hsaco-section-name-outside", "elf_section", f"{f}.hsaco",
         h.sh(".text", "name", h.size(".shstrtab")))
    case("hsaco-dynsym-entsize", "elf_section", f"{f}.hsaco", h.sh(".dynsym", "entsize", 16))
    case("hsaco-dynsym-retyped", "elf_section", f"{f}.hsaco", h.sh(".dynsym", "type", 2))
    case("hsaco-dynsym-links-code", "elf_section", f"{f}.hsaco",
         h.sh(".dynsym", "link", h.index(".text")))
    case("hsaco-note-cut", "elf_section", f"{f}.hsaco", h.sh(".note", "size", 13))
    # the metadata note (H3)
    case("hsaco-no-metadata-note", "hsaco_note", f"{f}.hsaco", patch(note_hdr + 8, le(33, 4)))
    case("hsaco-note-owner", "hsaco_note", f"{f}.hsaco", patch(note_hdr + 12, b"X".hex()))
    case("hsaco-note-not-msgpack", "hsaco_note", f"{f}.hsaco", patch(note_desc, "c1"))
    case("hsaco-note-no-kernels", "hsaco_note", f"{f}.hsaco",
         patch(h.in_note(b"amdhsa.kernels"), b"amdhsa.kernelz".hex()))
    case("hsaco-note-duplicate-key", "hsaco_note", f"{f}.hsaco",
         patch(h.in_note(b".vgpr_count"), b".sgpr_count".hex()))
    case("hsaco-note-size-nil", "hsaco_note", f"{f}.hsaco",
         patch(h.in_note(b"\xa5.size\x08", first=True) + 6, "c0"))
    # the hash (H4), then the kernel (H5-H9)
    case("hsaco-code-changed", "sha256", f"{f}.sha256",
         patch(h.offset(".text") + 16, bytes([h.data[h.offset(".text") + 16] ^ 1]).hex()))
    case("hsaco-entry-other-name", "no_entry_symbol", f"{f}.entry",
         jset(k4 + "/entry", entry + "_x"), jset(k4 + "/name", entry + "_x"))
    kd = entry.encode() + b".kd\x00"
    dynstr = h.offset(".dynstr")
    blob = h.data[dynstr:dynstr + h.size(".dynstr")]
    case("hsaco-descriptor-symbol-renamed", "no_entry_symbol", f"{f}.entry",
         patch(dynstr + blob.index(kd) + len(entry) + 1, b"x".hex()), rehash)
    dynsym = h.offset(".dynsym")
    kd_sym = next(dynsym + 24 * j for j in range(h.size(".dynsym") // 24)
                  if struct.unpack_from("<I", h.data, dynsym + 24 * j)[0] == blob.index(kd))
    case("hsaco-descriptor-section-out-of-range", "no_entry_symbol", f"{f}.entry",
         patch(kd_sym + 6, le(len(h.sections), 2)), rehash)
    case("hsaco-descriptor-not-an-object", "no_entry_symbol", f"{f}.entry",
         patch(kd_sym + 4, "12"), rehash)  # STB_GLOBAL, STT_FUNC
    case("hsaco-note-symbol-renamed", "no_entry_symbol", f"{f}.entry",
         patch(h.in_note(entry.encode() + b".kd") + len(entry) + 1, b"x".hex()), rehash)
    case("hsaco-arch-gfx90a", "arch", f"{f}.target.arch", patch(48, "3f"), rehash)
    case("hsaco-arch-unknown", "arch", f"{f}.target.arch", patch(48, "40"), rehash)
    case("hsaco-gfx90a-file-as-gfx942", "arch", f"{f}.target.arch",
         {"op": "copy", "from": H5, "to": H4}, rehash)
    case("hsaco-wavefront-32", "wavefront_size", f"{f}.target.warp_size",
         patch(h.in_note(b"\xaf.wavefront_size\x40") + 16, "20"), rehash)
    case("hsaco-wavefront-missing", "wavefront_size", f"{f}.target.warp_size",
         patch(h.in_note(b".wavefront_size"), b".wavefront_sizx".hex()), rehash)
    gb = h.in_note(b"global_buffer", first=True)
    case("hsaco-arg-made-hidden", "param_mismatch", f"{f}.num_params",
         patch(gb, b"hidden_buffer".hex()), rehash)
    case("hsaco-manifest-extra-arg", "param_mismatch", f"{f}.num_params",
         jset(k4 + "/signature", e4["signature"] + ["i32"]),
         jset(k4 + "/arg_names", e4["arg_names"] + ["extra"]),
         jset(k4 + "/num_params", e4["num_params"] + 1))
    j = e4["signature"].index("i32")
    case("hsaco-manifest-arg-widened", "param_mismatch", f"{f}.signature",
         jset(f"{k4}/signature/{j}", "i64"))
    case("hsaco-arg-offset", "param_mismatch", f"{f}.signature",
         patch(h.in_note(b"\xa7.offset\x08") + 8, "09"), rehash)
    wg = h.in_note(b"\xb8.max_flat_workgroup_size\xcd\x01\x00")
    case("hsaco-workgroup-128", "launch_shape", f"{f}.num_warps", patch(wg + 26, "0080"), rehash)
    return out

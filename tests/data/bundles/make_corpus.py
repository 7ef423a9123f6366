"""Writes the shared corpus of bad (and good) bundles that both loaders must judge alike.

    python tests/data/bundles/make_corpus.py --from DIR

DIR is a bundle built with ``luminamoon aot build --arch 80,90,100,gfx942,gfx90a --dtypes
fp32:fp32:fp32``; six of its commit variants become ``base/`` (four real cubins, about 45 KB:
sm_90, sm_90, sm_80 and an sm_100 one with ptxas's notes, .nv.compat and the Mercury copy; then two
AMD code objects, gfx942 and gfx90a, kernels[4] and kernels[5] of a format_version 3 manifest;
hip_cases.py writes their cases), and ``cases.json`` lists
each case as a list of operations on a copy of ``base/`` and the reason code and field both the
C++ loader (``AotManifest::load(dir, CubinCheck::kNow)``, optimizer/luminav-triton-aot/tests/
test_bundle_corpus.cpp) and the Python tooling (``load_bundle`` and the native module's
``load_manifest``, tests/test_bundle_rules.py) must refuse it with (``null`` for a good bundle
both accept). Byte offsets into the cubins are computed here from their ELF structure, so the
cases stay readable as names; regenerate after changing ``base/``.

Operations (applied in order by tests/bundle_corpus.py and by the C++ runner):
  {"op": "json", "path": "/kernels/0/num_warps", "value": V}   set (a JSON pointer)
  {"op": "json", "path": P, "remove": true}                    remove
  {"op": "write", "file": F, "text": T} or "hex": H            replace a file's bytes
  {"op": "patch", "file": F, "offset": N, "hex": H}            overwrite bytes at N
  {"op": "truncate", "file": F, "size": N}                      cut (or extend, sparse)
  {"op": "rehash", "file": F}                                   sha256 of F into every entry naming it
                                                                (its "cubin" or its "hsaco")
  {"op": "copy", "from": A, "to": B}, {"op": "remove", "file": F}
  {"op": "mkfifo" | "mkdir", "file": F}, {"op": "symlink", "file": F, "target": T}
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))

from luminamoon.aot.cubin import parse_cubin  # noqa: E402
from hip_cases import hip_cases  # noqa: E402  (this folder is on sys.path as the script's)

BASE_KEYS = [("commit.f0.T1024.w4", 90), ("commit.f1.T1024.w4", 90), ("commit.f1.T1024.w4", 80),
             ("commit.f0.T1024.w4", 100), ("commit.f1.T1024.w4", "gfx942"),
             ("commit.f1.T1024.w4", "gfx90a")]
C0 = "commit.f0.T1024.w4.sm90.cubin"  # kernels[0]'s cubin
C1 = "commit.f1.T1024.w4.sm90.cubin"
C2 = "commit.f1.T1024.w4.sm80.cubin"
C3 = "commit.f0.T1024.w4.sm100.cubin"  # kernels[3]'s: Blackwell, ELF ABI version 8
SH_FIELDS = {"name": (0, 4), "type": (4, 4), "flags": (8, 8), "offset": (24, 8), "size": (32, 8),
             "link": (40, 4), "info": (44, 4), "align": (48, 8), "entsize": (56, 8)}


def le(v: int, n: int) -> str:
    return (v & ((1 << (8 * n)) - 1)).to_bytes(n, "little").hex()


class Cubin:
    def __init__(self, data: bytes, file: str = C0) -> None:
        self.data = data
        self.file = file
        self.info = parse_cubin(data)
        self.shoff = struct.unpack_from("<Q", data, 0x28)[0]
        self.shnum = struct.unpack_from("<H", data, 0x3C)[0]

    def section(self, name_prefix: str):
        return next(s for s in self.info.sections if s.name.startswith(name_prefix))

    def sh(self, index: int, field: str, value: int) -> dict:
        off, n = SH_FIELDS[field]
        return {"op": "patch", "file": self.file, "offset": self.shoff + 64 * index + off,
                "hex": le(value, n)}

    def symbol_offset(self, name: str) -> int:
        symtab = self.section(".symtab")
        for j in range(symtab.size // 24):
            if self.info.symbols[j].name == name:
                return symtab.offset + 24 * j
        raise KeyError(name)

    def merc_symbol_offset(self, j: int) -> int:
        return self.section(".nv.merc.symtab").offset + 24 * j

    def nvinfo_records(self, section_name: str):
        """(offset in the file, format, attribute, value offset, value size) of each record."""
        s = self.section(section_name)
        p, out = 0, []
        blob = self.data[s.offset:s.offset + s.size]
        while p < len(blob):
            fmt, attr = blob[p], blob[p + 1]
            if fmt == 4:
                size = struct.unpack_from("<H", blob, p + 2)[0]
                out.append((s.offset + p, fmt, attr, s.offset + p + 4, size))
                p += 4 + size
            else:
                out.append((s.offset + p, fmt, attr, s.offset + p + 2, 2))
                p += 4
        return out


def patch(file: str, offset: int, hexbytes: str) -> dict:
    return {"op": "patch", "file": file, "offset": offset, "hex": hexbytes}


def rehash(file: str = C0) -> dict:
    return {"op": "rehash", "file": file}


def jset(path: str, value) -> dict:
    return {"op": "json", "path": path, "value": value}


def jdel(path: str) -> dict:
    return {"op": "json", "path": path, "remove": True}


def cases(base: str) -> list:
    man = json.load(open(os.path.join(base, "manifest.json")))
    raw = open(os.path.join(base, "manifest.json"), "rb").read()
    c0 = Cubin(open(os.path.join(base, C0), "rb").read())
    entry = man["kernels"][0]["entry"]
    text_index = c0.section(".text.").index
    info = c0.section(".nv.info." + entry)
    records = c0.nvinfo_records(".nv.info." + entry)
    kparams = [r for r in records if r[2] == 0x17]
    reqntid = next(r for r in records if r[2] == 0x10)
    cbank_size = next(r for r in records if r[2] == 0x19)
    regcount = next(r for r in c0.nvinfo_records(".nv.info") if r[2] == 0x2F)
    rela = c0.section(".rela.")
    symtab, strtab, shstrtab = c0.section(".symtab"), c0.section(".strtab"), c0.section(".shstrtab")
    entry_sym = c0.symbol_offset(entry)
    entry_name_at = strtab.offset + struct.unpack_from("<I", c0.data, entry_sym)[0]
    k0 = "/kernels/0"
    f = "kernels[0]"
    out = []

    def case(name, code, field, finding, *ops):
        out.append({"name": name, "code": code, "field": field, "finding": finding, "ops": list(ops)})

    # --- good bundles, both loaders accept them
    case("good-base", None, None, "", )
    case("good-format-version-1", None, None, "loaders agree", jset("/format_version", 1),
         jdel("/table_cols"), jdel("/kernels/5"), jdel("/kernels/4"))
    case("good-format-version-2-cuda-only", None, None, "loaders agree",
         jset("/format_version", 2), jdel("/kernels/5"), jdel("/kernels/4"))
    case("good-unknown-fields", None, None, "loaders agree", jset("/comment", "ignored"),
         jset(k0 + "/note", {"nested": [1, 2]}))
    case("good-symlink-inside", None, None, "files", {"op": "copy", "from": C0, "to": "real.bin"},
         {"op": "remove", "file": C0}, {"op": "symlink", "file": C0, "target": "real.bin"})
    case("good-triton-4-unknown-trailing", None, None, "loaders agree",
         jset(k0 + "/triton_version", "4.0.0"))

    # --- files (rules F1-F4)
    F = "files: FIFO, /dev/zero, bounded reads"
    case("manifest-missing", "missing_file", "(file)", F, {"op": "remove", "file": "manifest.json"})
    case("manifest-fifo", "not_regular_file", "(file)", F, {"op": "remove", "file": "manifest.json"},
         {"op": "mkfifo", "file": "manifest.json"})
    case("manifest-dev-zero", "not_regular_file", "(file)", F,
         {"op": "remove", "file": "manifest.json"},
         {"op": "symlink", "file": "manifest.json", "target": "/dev/zero"})
    case("manifest-directory", "not_regular_file", "(file)", F,
         {"op": "remove", "file": "manifest.json"}, {"op": "mkdir", "file": "manifest.json"})
    case("manifest-too-large", "too_large", "(file)", F,
         {"op": "truncate", "file": "manifest.json", "size": (16 << 20) + 1})
    case("cubin-missing", "missing_file", f"{f}.cubin", F, {"op": "remove", "file": C0})
    case("cubin-dangling-symlink", "missing_file", f"{f}.cubin", F, {"op": "remove", "file": C0},
         {"op": "symlink", "file": C0, "target": "nothing-here.bin"})
    case("cubin-fifo", "not_regular_file", f"{f}.cubin", F, {"op": "remove", "file": C0},
         {"op": "mkfifo", "file": C0})
    case("cubin-dev-zero", "not_regular_file", f"{f}.cubin", F, {"op": "remove", "file": C0},
         {"op": "symlink", "file": C0, "target": "/dev/zero"})
    case("cubin-symlink-outside", "not_regular_file", f"{f}.cubin", F, {"op": "remove", "file": C0},
         {"op": "symlink", "file": C0, "target": "/etc/passwd"})
    case("cubin-directory", "not_regular_file", f"{f}.cubin", F, {"op": "remove", "file": C0},
         {"op": "mkdir", "file": C0})
    case("cubin-symlink-loop", "unreadable", f"{f}.cubin", F, {"op": "remove", "file": C0},
         {"op": "symlink", "file": C0, "target": C0})
    case("cubin-too-large", "too_large", f"{f}.cubin", F,
         {"op": "truncate", "file": C0, "size": (64 << 20) + 1})

    # --- the JSON profile (J1-J5)
    J = "Python escapes: UnicodeDecodeError, RecursionError, huge integers, lone surrogates"
    text = raw.decode()
    case("json-invalid-utf8", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "hex": raw.replace(b'"luminamoon 0.1.0"', b'"luminamoon \xff\xfe"').hex()})
    case("json-overlong-utf8", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "hex": raw.replace(b'"luminamoon 0.1.0"', b'"luminamoon \xc0\xaf"').hex()})
    case("json-utf8-surrogate", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "hex": raw.replace(b'"luminamoon 0.1.0"', b'"luminamoon \xed\xa0\x80"').hex()})
    case("json-bom", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json", "hex": (b"\xef\xbb\xbf" + raw).hex()})
    case("json-lone-surrogate", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"luminamoon 0.1.0"', '"luminamoon \\ud800"')})
    case("json-lone-low-surrogate-key", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"created_by"', '"x\\udc00": 1, "created_by"')})
    case("json-depth-17", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"created_by"', '"deep": ' + "[" * 16 + "]" * 16 + ', "created_by"')})
    case("json-depth-5000", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"created_by"', '"deep": ' + "[" * 5000 + "]" * 5000 +
                               ', "created_by"')})
    case("json-int-2^64", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"num_warps": 4', '"num_warps": 18446744073709551616', 1)})
    case("json-int-2^63", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"num_warps": 4', '"num_warps": 9223372036854775808', 1)})
    case("json-int-5000-digits", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"num_warps": 4', '"num_warps": 1' + "0" * 5000, 1)})
    case("json-float", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"num_warps": 4', '"num_warps": 4.0', 1)})
    case("json-exponent-overflow", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"num_warps": 4', '"num_warps": 1e400', 1)})
    case("json-nan", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"num_warps": 4', '"num_warps": NaN', 1)})
    case("json-duplicate-key", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json",
          "text": text.replace('"num_warps": 4', '"num_warps": 4, "num_warps": 8', 1)})
    case("json-trailing-garbage", "bad_json", "(file)", J,
         {"op": "write", "file": "manifest.json", "text": text + "x"})
    case("json-nul-then-garbage", "bad_json", "(file)", "loaders agree",
         {"op": "write", "file": "manifest.json", "text": text + "\u0000 garbage"})
    case("json-empty", "bad_json", "(file)", J, {"op": "write", "file": "manifest.json", "text": ""})
    case("json-top-level-array", "bad_type", "(top level)", J,
         {"op": "write", "file": "manifest.json", "text": "[1, 2]"})

    # --- the schema (T, K)
    S = "loaders disagree with each other and with docs/bundle-format.md"
    case("format-other", "format", "format", S, jset("/format", "other-bundle"))
    case("format-version-4", "format_version", "format_version", S, jset("/format_version", 4))
    case("format-version-bool", "bad_type", "format_version", S, jset("/format_version", True))
    case("table-cols-0", "bad_value", "table_cols", S, jset("/table_cols", 0))
    case("top-triton-version-empty", "bad_value", "triton_version", S, jset("/triton_version", ""))
    case("kernels-empty", "bad_value", "kernels", S, jset("/kernels", []))
    case("kernel-not-object", "bad_type", "kernels[0]", S, jset(k0, 7))
    case("missing-entry-field", "missing_field", f"{f}.entry", S, jdel(k0 + "/entry"))
    case("missing-target-arch", "missing_field", f"{f}.target.arch", S, jdel(k0 + "/target/arch"))
    case("num-warps-string", "bad_type", f"{f}.num_warps", S, jset(k0 + "/num_warps", "4"))
    case("constexpr-bool", "bad_type", f"{f}.constexprs.CHECK_FLAG", S,
         jset(k0 + "/constexprs/CHECK_FLAG", False))
    case("signature-element-int", "bad_type", f"{f}.signature[1]", S, jset(k0 + "/signature/1", 5))
    case("kernel-unknown", "bad_value", f"{f}.kernel", S, jset(k0 + "/kernel", "pass3"))
    case("entry-not-identifier", "bad_value", f"{f}.entry", S, jset(k0 + "/entry", "a b"))
    case("sha256-uppercase", "bad_value", f"{f}.sha256", S,
         jset(k0 + "/sha256", man["kernels"][0]["sha256"].upper()))
    case("cubin-with-directory", "bad_value", f"{f}.cubin", S, jset(k0 + "/cubin", "../" + C0))
    case("cubin-with-nul", "bad_value", f"{f}.cubin", S, jset(k0 + "/cubin", "a\u0000" + C0))
    case("backend-rocm", "bad_value", f"{f}.target.backend", S,
         jset(k0 + "/target/backend", "rocm"))
    case("arch-9", "bad_value", f"{f}.target.arch", S, jset(k0 + "/target/arch", 9))
    case("warp-size-64", "bad_value", f"{f}.target.warp_size", S, jset(k0 + "/target/warp_size", 64))
    case("triton-version-empty", "bad_value", f"{f}.triton_version", S,
         jset(k0 + "/triton_version", ""))
    for v in (0, 3, 64):
        case(f"num-warps-{v}", "bad_value", f"{f}.num_warps", S, jset(k0 + "/num_warps", v))
    case("num-ctas-17", "bad_value", f"{f}.num_ctas", S, jset(k0 + "/num_ctas", 17))
    case("num-stages-65", "bad_value", f"{f}.num_stages", S, jset(k0 + "/num_stages", 65))
    case("shared-mem-2^31", "bad_value", f"{f}.shared_mem", S, jset(k0 + "/shared_mem", 1 << 31))
    case("shared-mem-negative", "bad_value", f"{f}.shared_mem", S, jset(k0 + "/shared_mem", -1))
    case("signature-i8", "bad_value", f"{f}.signature[2]", S, jset(k0 + "/signature/2", "i8"))
    case("signature-fp8-pointer", "bad_value", f"{f}.signature[0]", S,
         jset(k0 + "/signature/0", "*fp8e4nv"))
    case("arg-names-short", "num_params", f"{f}.arg_names", S, jdel(k0 + "/arg_names/2"))
    case("constexpr-unknown", "bad_value", f"{f}.constexprs.EXTRA", S,
         jset(k0 + "/constexprs/EXTRA", 1))
    case("trailing-3", "bad_value", f"{f}.num_trailing_scratch_ptrs", S,
         jset(k0 + "/num_trailing_scratch_ptrs", 3), jset(k0 + "/num_params", 6))
    case("num-params-off", "num_params", f"{f}.num_params", S, jset(k0 + "/num_params", 6))
    case("global-scratch-2^41", "bad_value", f"{f}.global_scratch_size", S,
         jset(k0 + "/global_scratch_size", 1 << 41))
    case("scratch-align-3", "bad_value", f"{f}.global_scratch_align", S,
         jset(k0 + "/global_scratch_align", 3))
    case("scratch-without-pointer", "scratch", f"{f}.global_scratch_size", S,
         jset(k0 + "/num_trailing_scratch_ptrs", 0), jset(k0 + "/num_params", 3),
         jset(k0 + "/global_scratch_size", 64))
    case("trailing-wrong-for-triton-version", "scratch", f"{f}.num_trailing_scratch_ptrs", S,
         jset(k0 + "/num_trailing_scratch_ptrs", 1), jset(k0 + "/num_params", 4))
    K = "swapped keys launch the other variant"
    case("keys-swapped", "key_mismatch", f"{f}.key", K, jset(k0 + "/key", man["kernels"][1]["key"]),
         jset("/kernels/1/key", man["kernels"][0]["key"]))
    case("cubins-swapped", "key_mismatch", f"{f}.cubin", K,
         jset(k0 + "/cubin", man["kernels"][1]["cubin"]), jset(k0 + "/sha256", man["kernels"][1]["sha256"]),
         jset("/kernels/1/cubin", man["kernels"][0]["cubin"]),
         jset("/kernels/1/sha256", man["kernels"][0]["sha256"]))
    case("constexpr-changed", "key_mismatch", f"{f}.key", K, jset(k0 + "/constexprs/CHECK_FLAG", 1))
    case("num-warps-changed", "key_mismatch", f"{f}.key", K, jset(k0 + "/num_warps", 8))
    case("duplicate-entry", "duplicate", "kernels[3]", S, jset("/kernels/3", man["kernels"][0]))

    # --- cubins: the ELF structure (E1-E30), each with its hash updated to match
    E = "a corrupted cubin, rehashed, segfaults cuModuleLoadData"
    n = len(c0.data)
    case("elf-empty", "truncated", f"{f}.cubin", E, {"op": "truncate", "file": C0, "size": 0}, rehash())
    case("elf-cut-40", "truncated", f"{f}.cubin", E, {"op": "truncate", "file": C0, "size": 40}, rehash())
    case("elf-cut-1000", "truncated", f"{f}.cubin", E, {"op": "truncate", "file": C0, "size": 1000},
         rehash())
    case("elf-cut-last-byte", "truncated", f"{f}.cubin", E, {"op": "truncate", "file": C0, "size": n - 1},
         rehash())
    case("elf-magic", "elf_header", f"{f}.cubin", E, patch(C0, 1, b"X".hex()), rehash())
    case("elf-class-32", "elf_header", f"{f}.cubin", E, patch(C0, 4, "01"), rehash())
    case("elf-machine-x86-64", "elf_header", f"{f}.cubin", E, patch(C0, 0x12, le(62, 2)), rehash())
    case("elf-abi-version-9", "elf_header", f"{f}.cubin", E, patch(C0, 8, "09"), rehash())
    case("elf-type-rel", "elf_header", f"{f}.cubin", E, patch(C0, 0x10, le(1, 2)), rehash())
    case("elf-shentsize-40", "elf_header", f"{f}.cubin", E, patch(C0, 0x3A, le(40, 2)), rehash())
    case("elf-shnum-0", "elf_header", f"{f}.cubin", E, patch(C0, 0x3C, le(0, 2)), rehash())
    case("elf-shstrndx-past-end", "elf_header", f"{f}.cubin", E, patch(C0, 0x3E, le(c0.shnum, 2)),
         rehash())
    case("elf-shstrndx-0", "elf_header", f"{f}.cubin", E, patch(C0, 0x3E, le(0, 2)), rehash())
    case("elf-shstrndx-xindex", "elf_header", f"{f}.cubin", E, patch(C0, 0x3E, le(0xFFFF, 2)),
         rehash())
    case("elf-phentsize-32", "elf_header", f"{f}.cubin", E, patch(C0, 0x36, le(32, 2)), rehash())
    case("elf-shoff-past-end", "truncated", f"{f}.cubin", E, patch(C0, 0x28, le(n, 8)), rehash())
    case("elf-shoff-huge", "truncated", f"{f}.cubin", E, patch(C0, 0x28, le(2 ** 64 - 8, 8)), rehash())
    case("elf-phoff-past-end", "truncated", f"{f}.cubin", E, patch(C0, 0x20, le(n, 8)), rehash())
    case("elf-section-offset-past-end", "truncated", f"{f}.cubin", E,
         c0.sh(text_index, "offset", n), rehash())
    case("elf-section-size-huge", "truncated", f"{f}.cubin", E,
         c0.sh(text_index, "size", 2 ** 63), rehash())
    case("elf-section-0-not-null", "elf_section", f"{f}.cubin", E, c0.sh(0, "type", 1), rehash())
    case("elf-sh-name-past-table", "elf_section", f"{f}.cubin", E,
         c0.sh(text_index, "name", shstrtab.size + 5), rehash())
    case("elf-sh-type-unknown", "elf_section", f"{f}.cubin", E, c0.sh(text_index, "type", 0x12345),
         rehash())
    case("elf-sh-type-dynamic", "elf_section", f"{f}.cubin", E, c0.sh(4, "type", 6), rehash())
    case("elf-sh-flags-compressed", "elf_section", f"{f}.cubin", E,
         c0.sh(text_index, "flags", 0x806), rehash())
    case("elf-sh-align-3", "elf_section", f"{f}.cubin", E, c0.sh(text_index, "align", 3), rehash())
    case("elf-symtab-entsize-16", "elf_section", f"{f}.cubin", E, c0.sh(symtab.index, "entsize", 16),
         rehash())
    case("elf-debug-entsize", "elf_section", f"{f}.cubin", E,
         c0.sh(c0.section(".nv_debug_line_sass").index, "entsize", 0x80000000), rehash())
    case("elf-callgraph-entsize-0", "elf_section", f"{f}.cubin", E,
         c0.sh(c0.section(".nv.callgraph").index, "entsize", 0), rehash())
    case("elf-sh-link-out-of-range", "elf_section", f"{f}.cubin", E,
         c0.sh(text_index, "link", c0.shnum + 3), rehash())
    case("elf-symtab-link-not-strtab", "elf_section", f"{f}.cubin", E,
         c0.sh(symtab.index, "link", 4), rehash())
    case("elf-rela-link-not-symtab", "elf_section", f"{f}.cubin", E, c0.sh(rela.index, "link", 1),
         rehash())
    case("elf-shstrtab-not-nul-terminated", "elf_section", f"{f}.cubin", E,
         patch(C0, shstrtab.offset + shstrtab.size - 1, b"x".hex()), rehash())
    case("elf-shstrndx-not-strtab", "elf_section", f"{f}.cubin", E,
         patch(C0, 0x3E, le(symtab.index, 2)), rehash())
    case("elf-sections-overlap", "elf_section", f"{f}.cubin", E,
         c0.sh(text_index, "offset", info.offset), rehash())
    case("elf-section-over-headers", "elf_section", f"{f}.cubin", E, c0.sh(4, "offset", 8), rehash())
    case("elf-two-symtabs", "elf_section", f"{f}.cubin", E, c0.sh(4, "type", 2),
         c0.sh(4, "entsize", 24), c0.sh(4, "size", 96), c0.sh(4, "link", strtab.index), rehash())
    case("elf-sh-info-rela-out-of-range", "elf_section", f"{f}.cubin", E,
         c0.sh(rela.index, "info", 200), rehash())
    case("elf-sh-info-text-symbol", "elf_section", f"{f}.cubin", E,
         c0.sh(text_index, "info", 9999), rehash())
    case("elf-sh-info-symtab", "elf_section", f"{f}.cubin", E,
         c0.sh(symtab.index, "info", 9999), rehash())
    case("elf-sh-info-plain", "elf_section", f"{f}.cubin", E, c0.sh(4, "info", 3), rehash())
    case("elf-symbol-name-past-strtab", "elf_section", f"{f}.cubin", E,
         patch(C0, entry_sym, le(strtab.size + 1, 4)), rehash())
    case("elf-symbol-section-out-of-range", "elf_section", f"{f}.cubin", E,
         patch(C0, entry_sym + 6, le(500, 2)), rehash())
    case("elf-symbol-past-its-section", "elf_section", f"{f}.cubin", E,
         patch(C0, entry_sym + 16, le(1 << 40, 8)), rehash())
    case("elf-relocation-symbol", "elf_section", f"{f}.cubin", E,
         patch(C0, rela.offset + 12, le(9999, 4)), rehash())
    case("elf-relocation-offset", "elf_section", f"{f}.cubin", E,
         patch(C0, rela.offset, le(1 << 32, 8)), rehash())
    case("elf-nvinfo-format-9", "elf_section", f"{f}.cubin", E, patch(C0, kparams[0][0], "09"),
         rehash())
    case("elf-nvinfo-record-too-long", "elf_section", f"{f}.cubin", E,
         patch(C0, kparams[0][0] + 2, le(0xFFF0, 2)), rehash())
    case("elf-nvinfo-kparam-short", "elf_section", f"{f}.cubin", E,
         patch(C0, kparams[-1][0] + 2, le(8, 2)), rehash())
    case("elf-nvinfo-regcount-symbol", "elf_section", f"{f}.cubin", E,
         patch(C0, regcount[3], le(999, 4)), rehash())
    case("elf-nvinfo-exit-offset", "elf_section", f"{f}.cubin", E,
         patch(C0, next(r for r in records if r[2] == 0x1C)[3], le(1 << 30, 4)), rehash())
    case("elf-nvinfo-link-not-code", "elf_section", f"{f}.cubin", E, c0.sh(info.index, "info", 4),
         rehash())
    case("elf-callgraph-symbol", "elf_section", f"{f}.cubin", E,
         patch(C0, c0.section(".nv.callgraph").offset, le(5000, 4)), rehash())
    case("elf-sh-type-cuda-resolved-rela", "elf_section", f"{f}.cubin", E,
         c0.sh(4, "type", 0x70000003), rehash())
    case("elf-sh-type-note", "elf_section", f"{f}.cubin", E, c0.sh(4, "type", 7), rehash())
    case("elf-sh-addr-nonzero", "elf_section", f"{f}.cubin", E,
         patch(C0, c0.shoff + 64 * text_index + 16, le(0x1000, 8)), rehash())
    case("elf-sh-flags-os-bit", "elf_section", f"{f}.cubin", E,
         c0.sh(text_index, "flags", 0x200006), rehash())
    phoff = struct.unpack_from("<Q", c0.data, 0x20)[0]
    phnum = struct.unpack_from("<H", c0.data, 0x38)[0]
    segs = [struct.unpack_from("<IIQQQQQQ", c0.data, phoff + 56 * i) for i in range(phnum)]
    text = c0.section(".text.")
    text_seg = next(i for i, sg in enumerate(segs) if sg[0] == 1 and sg[2] <= text.offset
                    and text.offset + text.size <= sg[2] + sg[5])
    case("elf-segment-address", "elf_section", f"{f}.cubin", E,
         patch(C0, phoff + 56 * text_seg + 16, le(0x10000, 8)), rehash())
    case("elf-segment-type-dynamic", "elf_section", f"{f}.cubin", E,
         patch(C0, phoff + 56 * text_seg, le(2, 4)), rehash())
    case("elf-code-outside-load-segments", "elf_section", f"{f}.cubin", E,
         patch(C0, phoff + 56 * text_seg + 32, le(0, 8)), rehash())
    sect_sym = next(j for j, sym in enumerate(c0.info.symbols) if sym.type == 3)
    case("elf-section-symbol-value", "elf_section", f"{f}.cubin", E,
         patch(C0, symtab.offset + 24 * sect_sym + 8, le(0x40, 8)), rehash())
    case("elf-nvinfo-unknown-attribute", "elf_section", f"{f}.cubin", E,
         patch(C0, next(r for r in records if r[2] == 0x50)[0] + 1, "60"), rehash())
    case("elf-nvinfo-offsets-as-externs", "elf_section", f"{f}.cubin", E,
         patch(C0, next(r for r in records if r[2] == 0x1C)[0] + 1, "0f"), rehash())
    frame = next(r for r in c0.nvinfo_records(".nv.info") if r[2] == 0x11)
    case("elf-nvinfo-module-record-symbol", "elf_section", f"{f}.cubin", E,
         patch(C0, frame[0] + 1, "37"), patch(C0, frame[3], le(999, 4)), rehash())
    # E30: what the driver reads of a kernel at its first launch; without it the launch breaks
    # the CUDA context (a sticky error) instead of the load failing: the campaign's
    # elf_nvinfo-00613, elf_nvinfo-00624 and elf_section-00255
    K = "the first launch breaks the CUDA context"
    module = c0.section(".nv.info")
    assert module.name == ".nv.info" and not module.flags & 0x40
    cbank = next(r for r in records if r[2] == 0x0A)
    min_stack = next(r for r in c0.nvinfo_records(".nv.info") if r[2] == 0x12)
    case("elf-kernel-param-cbank-retagged", "elf_section", f"{f}.cubin", K,
         patch(C0, cbank[0] + 1, "29"), rehash())
    case("elf-kernel-param-cbank-not-constant-bank", "elf_section", f"{f}.cubin", K,
         patch(C0, cbank[3], le(next(j for j, sym in enumerate(c0.info.symbols)
                                     if sym.type == 3 and sym.shndx == text_index), 4)), rehash())
    case("elf-kernel-regcount-retagged", "elf_section", f"{f}.cubin", K,
         patch(C0, regcount[0] + 1, "01"), rehash())
    case("elf-kernel-min-stack-size-retagged", "elf_section", f"{f}.cubin", K,
         patch(C0, min_stack[0] + 1, "11"), rehash())
    case("elf-kernel-module-nvinfo-empty", "elf_section", f"{f}.cubin", K,
         c0.sh(module.index, "size", 0), rehash())
    case("elf-segment-past-end", "truncated", f"{f}.cubin", E,
         patch(C0, struct.unpack_from("<Q", c0.data, 0x20)[0] + 8, le(n, 8)), rehash())

    # --- Blackwell cubins (sm_100 and later): ptxas's notes, .nv.compat, the Mercury copy
    out += blackwell_cases(base)

    # --- cubins: what the manifest says of them (C3-C6)
    case("cubin-modified-not-rehashed", "sha256", f"{f}.sha256", "hashes",
         patch(C0, c0.section(".text.").offset + 16, "ff"))
    N = "C++ verify accepts a missing entry symbol"
    case("entry-symbol-renamed", "no_entry_symbol", f"{f}.entry", N,
         patch(C0, entry_name_at, b"X".hex()), rehash())
    case("entry-symbol-local", "no_entry_symbol", f"{f}.entry", N,
         patch(C0, entry_sym + 4, "02"), rehash())
    case("entry-not-marked-cuda-entry", "no_entry_symbol", f"{f}.entry", N,
         patch(C0, entry_sym + 5, "00"), rehash())
    case("entry-not-in-cubin", "no_entry_symbol", f"{f}.entry", N,
         jset(k0 + "/entry", "_lumina_tdclm_pass2_kernel"))
    # the driver finds the code by its section's name, .text.<entry> (cuModuleGetFunction:
    # CUDA_ERROR_NOT_FOUND); the campaign's elf_bytes-00785 and elf_section-00276
    text_name = c0.info.sections[text_index]
    text_name_at = shstrtab.offset + struct.unpack_from("<I", c0.data, c0.shoff + 64 * text_index)[0]
    assert text_name.name == ".text." + entry
    case("entry-code-section-renamed", "no_entry_symbol", f"{f}.entry", N,
         patch(C0, text_name_at + len(".text._"), b"X".hex()), rehash())
    case("entry-code-section-other-name", "no_entry_symbol", f"{f}.entry", N,
         c0.sh(text_index, "name", struct.unpack_from("<I", c0.data, c0.shoff + 64 * info.index)[0]),
         rehash())
    A = "C++ verify accepts a cubin arch other than target.arch"
    case("arch-e-flags-80", "arch", f"{f}.target.arch", A, patch(C0, 0x30, le(80, 1)), rehash())
    case("arch-sm80-code-in-sm90-entry", "arch", f"{f}.target.arch", A,
         {"op": "copy", "from": C2, "to": C0}, rehash())
    P = "C++ verify accepts argument sizes that disagree with the cubin"
    case("param-size-changed", "param_mismatch", f"{f}.signature", P,
         patch(C0, kparams[0][3] + 8, le(((16 << 18) | 0x1F400), 4)), rehash())
    case("param-ordinal-repeated", "param_mismatch", f"{f}.num_params", P,
         patch(C0, kparams[0][3] + 4, le(0, 2)), rehash())
    case("param-offset-changed", "param_mismatch", f"{f}.signature", P,
         patch(C0, kparams[2][3] + 6, le(0x14, 2)), rehash())
    case("param-bank-size-changed", "param_mismatch", f"{f}.signature", P,
         patch(C0, cbank_size[3], le(0x60, 2)), rehash())
    case("param-signature-word", "param_mismatch", f"{f}.signature", P,
         jset(k0 + "/signature/2", "i64"))
    case("param-count-older-triton", "param_mismatch", f"{f}.num_params",
         "C++ verify accepts a scratch-pointer count wrong for the Triton version",
         jset(k0 + "/num_trailing_scratch_ptrs", 1), jset(k0 + "/num_params", 4),
         jset(k0 + "/triton_version", "3.4.0"))
    case("block-size-changed", "launch_shape", f"{f}.num_warps", "the engine launches another variant",
         patch(C0, reqntid[3], le(256, 4)), rehash())
    return out


def blackwell_cases(base: str) -> list:
    """kernels[3]: an sm_100 cubin, each structure ptxas adds for Blackwell broken once."""
    c3 = Cubin(open(os.path.join(base, C3), "rb").read(), C3)
    f = "kernels[3]"
    out = []

    def case(name, code, field, *ops):
        out.append({"name": name, "code": code, "field": field,
                    "finding": "Blackwell: notes, .nv.compat, the Mercury copy", "ops": list(ops)})

    def bad(name, *ops):
        case(name, "elf_section", f"{f}.cubin", *ops, rehash(C3))

    text = c3.section(".text.")
    tk, cv = c3.section(".note.nv.tkinfo"), c3.section(".note.nv.cuver")
    compat = c3.section(".nv.compat")
    ptx, merc_ptx = c3.section(".nv_debug_ptx_txt"), c3.section(".nv.merc.nv_debug_ptx_txt")
    merc_frame = c3.section(".nv.merc.debug_frame")
    capmerc = c3.section(".nv.capmerc.text.")
    msymtab = c3.section(".nv.merc.symtab")
    minfo = c3.section(".nv.merc.nv.info.")
    mrela = c3.section(".nv.merc.rela.debug_line")
    rela = c3.section(".rela.debug_line")
    strtab = c3.section(".strtab")
    mrecords = c3.nvinfo_records(minfo.name)
    mkparams = [r for r in mrecords if r[2] == 0x17]
    mreqntid = next(r for r in mrecords if r[2] == 0x10)
    mregcount = next(r for r in c3.nvinfo_records(".nv.merc.nv.info") if r[2] == 0x2F)
    maxreg = next(r for r in c3.nvinfo_records(".nv.info.") if r[2] == 0x1B)
    merc_entry = next(j for j, s in enumerate(c3.info.merc_symbols) if s.other & 0x10)
    merc_object = next(j for j, s in enumerate(c3.info.merc_symbols) if s.type == 1)
    tk_desc = tk.offset + 12 + 12  # after the note header and the 12-byte owner
    # notes (E28)
    bad("blackwell-note-owner", patch(C3, tk.offset + 12, b"X".hex()))
    bad("blackwell-note-past-its-section", patch(C3, tk.offset + 4, le(0x1000, 4)))
    bad("blackwell-note-toolkit-string-offset", patch(C3, tk_desc + 8, le(5000, 4)))
    bad("blackwell-note-type", patch(C3, cv.offset + 8, le(3000, 4)))
    bad("blackwell-note-cuda-version-size", patch(C3, cv.offset + 4, le(4, 4)))
    bad("blackwell-note-links-code", c3.sh(cv.index, "link", text.index))
    bad("blackwell-note-bits-on-code", c3.sh(text.index, "flags", text.flags | 0x1000000))
    # overlaps (E21): a Mercury view shares the bytes of one data section, nothing else
    bad("blackwell-mercury-view-of-code", c3.sh(merc_ptx.index, "offset", text.offset),
        c3.sh(merc_ptx.index, "size", text.size))
    bad("blackwell-mercury-view-flags", c3.sh(merc_ptx.index, "flags", 0x10000002))
    bad("blackwell-plain-twins", c3.sh(merc_ptx.index, "flags", 0))
    bad("blackwell-mercury-view-twice", c3.sh(merc_frame.index, "offset", ptx.offset),
        c3.sh(merc_frame.index, "size", ptx.size))
    bad("blackwell-mercury-view-partial", c3.sh(merc_ptx.index, "size", ptx.size - 1))
    # the Mercury bit and types (E18, E22-E24)
    bad("blackwell-capmerc-without-mercury-bit", c3.sh(capmerc.index, "flags", 0))
    bad("blackwell-mercury-bit-on-code", c3.sh(text.index, "flags", text.flags | 0x10000000))
    bad("blackwell-mercury-symtab-link", c3.sh(msymtab.index, "link", c3.section(".symtab").index))
    bad("blackwell-mercury-nvinfo-links-symtab", c3.sh(minfo.index, "link",
                                                       c3.section(".symtab").index))
    bad("blackwell-two-mercury-symtabs", c3.sh(merc_frame.index, "type", 0x70000085),
        c3.sh(merc_frame.index, "entsize", 24), c3.sh(merc_frame.index, "size", 96),
        c3.sh(merc_frame.index, "link", strtab.index))
    bad("blackwell-capmerc-names-a-section-symbol", c3.sh(capmerc.index, "info", 1))
    bad("blackwell-capmerc-sh-info-past-symbols", c3.sh(capmerc.index, "info", 500))
    bad("blackwell-mercury-symbol-name", patch(C3, c3.merc_symbol_offset(merc_entry),
                                               le(strtab.size + 1, 4)))
    bad("blackwell-mercury-object-past-its-code",
        patch(C3, c3.merc_symbol_offset(merc_object) + 6, le(capmerc.index, 2)),
        patch(C3, c3.merc_symbol_offset(merc_object) + 8,
              le(c3.info.merc_symbols[merc_entry].size - 2, 8)))
    # Mercury relocations, attributes (E25-E26)
    bad("blackwell-mercury-relocation-symbol", patch(C3, mrela.offset + 12, le(9999, 4)))
    bad("blackwell-mercury-relocation-offset", patch(C3, mrela.offset, le(1 << 32, 8)))
    bad("blackwell-mercury-relocates-plain",
        c3.sh(mrela.index, "info", c3.section(".debug_line").index))
    bad("blackwell-plain-relocates-mercury", c3.sh(rela.index, "info",
                                                   c3.section(".nv.merc.debug_line").index))
    bad("blackwell-mercury-nvinfo-describes-code", c3.sh(minfo.index, "info", text.index))
    bad("blackwell-mercury-nvinfo-exit-offset",
        patch(C3, next(r for r in mrecords if r[2] == 0x1C)[3],
              le(c3.info.merc_symbols[merc_entry].size, 4)))
    bad("blackwell-mercury-nvinfo-regcount-symbol",
        patch(C3, mregcount[3], le(len(c3.info.merc_symbols), 4)))
    # E30 for the Mercury copy: its module-wide records of the kernel, once each
    mframe = next(r for r in c3.nvinfo_records(".nv.merc.nv.info") if r[2] == 0x11)
    bad("blackwell-mercury-kernel-frame-size-retagged", patch(C3, mframe[0] + 1, "12"))
    bad("blackwell-nvinfo-unnamed-attribute-format", patch(C3, maxreg[0] + 1, "6d"))
    bad("blackwell-nvinfo-attribute-0x60", patch(C3, maxreg[0] + 1, "60"))
    # .nv.compat (E29)
    bad("blackwell-compat-repeated", patch(C3, compat.offset + 4 + 1,
                                           c3.data[compat.offset + 1:compat.offset + 2].hex()))
    bad("blackwell-compat-unknown-attribute", patch(C3, compat.offset + 1, "40"))
    bad("blackwell-compat-format", patch(C3, compat.offset, "09"))
    bad("blackwell-compat-cut", c3.sh(compat.index, "size", compat.size - 1))
    # the Mercury copy's parameters and block (C6)
    case("blackwell-mercury-param-offset", "param_mismatch", f"{f}.signature",
         patch(C3, mkparams[2][3] + 6, le(0x14, 2)), rehash(C3))
    case("blackwell-mercury-param-ordinal-repeated", "param_mismatch", f"{f}.num_params",
         patch(C3, mkparams[0][3] + 4, le(0, 2)) if
         struct.unpack_from("<H", c3.data, mkparams[0][3] + 4)[0] != 0 else
         patch(C3, mkparams[0][3] + 4, le(1, 2)), rehash(C3))
    case("blackwell-mercury-block-size", "launch_shape", f"{f}.num_warps",
         patch(C3, mreqntid[3], le(256, 4)), rehash(C3))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", required=True,
                    help="a bundle built for sm_80, sm_90, sm_100, gfx942 and gfx90a")
    args = ap.parse_args()
    man = json.load(open(os.path.join(args.src, "manifest.json")))
    by = {(e["key"], e["target"]["arch"]): e for e in man["kernels"]}
    base = os.path.join(HERE, "base")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    kernels = [by[k] for k in BASE_KEYS]
    for e in kernels:
        name = e.get("hsaco", e.get("cubin"))
        shutil.copyfile(os.path.join(args.src, name), os.path.join(base, name))
    man["kernels"] = kernels
    man["format_version"] = 3
    man["created_by"] = "luminamoon 0.1.0"
    with open(os.path.join(base, "manifest.json"), "w") as f:
        json.dump(man, f, indent=2)
        f.write("\n")
    out = cases(base) + hip_cases(base)
    with open(os.path.join(HERE, "cases.json"), "w") as f:
        json.dump({"comment": "generated by make_corpus.py; see its docstring", "cases": out}, f,
                  indent=1)
        f.write("\n")
    print(f"{len(out)} cases, base of {len(kernels)} cubins and hsacos in {base}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""scripts/gpu/campaign_mutations.py: the bundle campaign's mutants: seeded mutations of the
base bundle (operations in tests/bundle_corpus.py's format, plus "splice") and applying them."""
from __future__ import annotations

import json
import os
import random
import struct
from typing import Any, Dict, List, Tuple

from campaign_common import FAMILIES  # first: it puts tests/ and python/ on sys.path

import bundle_corpus  # tests/bundle_corpus.py: the corpus and its operations


# --------------------------------------------------------------------------------------------
# Mutations (operations in tests/bundle_corpus.py's format, plus "splice")
# --------------------------------------------------------------------------------------------
SH_FIELDS = [("name", 0, 4), ("type", 4, 4), ("flags", 8, 8), ("addr", 16, 8), ("offset", 24, 8),
             ("size", 32, 8), ("link", 40, 4), ("info", 44, 4), ("align", 48, 8),
             ("entsize", 56, 8)]
EH_FIELDS = [("ident", 0, 1), ("class", 4, 1), ("data", 5, 1), ("version", 6, 1),
             ("osabi", 7, 1), ("abiversion", 8, 1), ("type", 16, 2), ("machine", 18, 2),
             ("e_version", 20, 4), ("entry", 24, 8), ("phoff", 32, 8), ("shoff", 40, 8),
             ("flags", 48, 4), ("ehsize", 52, 2), ("phentsize", 54, 2), ("phnum", 56, 2),
             ("shentsize", 58, 2), ("shnum", 60, 2), ("shstrndx", 62, 2)]
SYM_FIELDS = [("name", 0, 4), ("info", 4, 1), ("other", 5, 1), ("shndx", 6, 2), ("value", 8, 8),
              ("size", 16, 8)]
BAD_VALUES = [None, True, False, -1, 0, 1, 2, 3, 7, 17, 31, 33, 64, 65, 255, 1 << 31,
              (1 << 31) - 1, 1 << 40, (1 << 41), (1 << 63) - 1, -(1 << 63), "", "x", "0", "90",
              "*i32", "i8", "../a", "a/b", "pass9", "3.6.0", "3.2.0", "\u0000", [], {}, [1], {"a": 1}]
TOKENS = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"-", b"0", b"9" * 25, b"1e999", b"0.5",
          b"true", b"null", b"NaN", b"\\ud800", b"\\u0000", b"\xff", b"\xc0\x80", b"\xed\xa0\x80",
          b"\xef\xbb\xbf", b"[" * 40, b"\x00"]


class CubinView:
    def __init__(self, data: bytes) -> None:
        from luminamoon.aot.cubin import parse_cubin

        self.data, self.info = data, parse_cubin(data)
        self.shoff = struct.unpack_from("<Q", data, 0x28)[0]
        self.shnum = struct.unpack_from("<H", data, 0x3C)[0]
        self.phoff = struct.unpack_from("<Q", data, 0x20)[0]
        self.phnum = struct.unpack_from("<H", data, 0x38)[0]

    def regions(self) -> List[Tuple[int, int]]:
        out = [(0, 64), (self.shoff, self.shoff + 64 * self.shnum),
               (self.phoff, self.phoff + 56 * self.phnum)]
        for s in self.info.sections:
            if s.name in (".symtab", ".strtab", ".shstrtab", ".nv.callgraph") or \
                    s.name.startswith((".nv.info", ".rela", ".rel.")):
                out.append((s.offset, s.offset + s.size))
        return [r for r in out if r[1] > r[0]]

    def nvinfo_records(self) -> List[Tuple[int, int, int]]:
        """(record offset, value offset, value size) of every .nv.info record."""
        out = []
        for s in self.info.sections:
            if s.type != 0x70000000:
                continue
            p = 0
            while p + 4 <= s.size:
                fmt = self.data[s.offset + p]
                size = struct.unpack_from("<H", self.data, s.offset + p + 2)[0] if fmt == 4 else 0
                out.append((s.offset + p, s.offset + p + (4 if fmt == 4 else 2),
                            size if fmt == 4 else 2))
                p += 4 + size if fmt == 4 else 4
        return out


def _edge(rng: random.Random, width: int, old: int, view: CubinView) -> int:
    n = len(view.data)
    pool = [0, 1, 2, 0x7F, 0xFF, n, n - 1, n + 1, view.shnum, view.shnum - 1, view.shnum + 1,
            1 << 31, (1 << 32) - 1, 1 << 63, (1 << 64) - 1, old + 1, old - 1, old ^ 1,
            old << 1, rng.getrandbits(8 * width)]
    return rng.choice(pool) & ((1 << (8 * width)) - 1)


def _patch(file: str, offset: int, value: int, width: int) -> Dict[str, Any]:
    return {"op": "patch", "file": file, "offset": offset,
            "hex": value.to_bytes(width, "little").hex()}


def generate(base: str, man: Dict[str, Any], count: int, seed: int) -> List[Dict[str, Any]]:
    rng = random.Random(seed)
    raw = open(os.path.join(base, "manifest.json"), "rb").read()
    cubins = [e["cubin"] for e in man["kernels"]]
    views = {c: CubinView(open(os.path.join(base, c), "rb").read()) for c in cubins}
    total = sum(FAMILIES.values())
    plan = {k: max(1, round(v * count / total)) for k, v in FAMILIES.items()}
    out: List[Dict[str, Any]] = []

    def add(family: str, what: str, ops: List[Dict[str, Any]]) -> None:
        out.append({"id": f"{family}-{len(out):05d}", "family": family, "what": what, "ops": ops})

    def add_field(family: str, c: str, v: CubinView, what, at: int, width: int) -> None:
        """A mutant that sets the width-byte field at ``at`` of cubin c to an edge value;
        ``what(old, new)`` describes it."""
        old = int.from_bytes(v.data[at:at + width], "little")
        new = _edge(rng, width, old, v)
        add(family, f"{c}: {what(old, new)}", [_patch(c, at, new, width),
                                               {"op": "rehash", "file": c}])

    for _ in range(plan["elf_header"]):
        c = rng.choice(cubins)
        v = views[c]
        name, off, width = rng.choice(EH_FIELDS)
        add_field("elf_header", c, v, lambda old, new: f"{name} {old:#x} -> {new:#x}", off, width)
    for _ in range(plan["elf_section"]):
        c = rng.choice(cubins)
        v = views[c]
        i = rng.randrange(v.shnum)
        name, off, width = rng.choice(SH_FIELDS)
        sec = v.info.sections[i].name or "(null)"
        add_field("elf_section", c, v,
                  lambda old, new: f"section {i} {sec} sh_{name} {old:#x} -> {new:#x}",
                  v.shoff + 64 * i + off, width)
    for _ in range(plan["elf_symbol"]):
        c = rng.choice(cubins)
        v = views[c]
        symtab = next(s for s in v.info.sections if s.type == 2)
        j = rng.randrange(symtab.size // 24)
        name, off, width = rng.choice(SYM_FIELDS)
        sym = v.info.symbols[j].name or "(null)"
        add_field("elf_symbol", c, v, lambda old, new: f"symbol {j} {sym} st_{name} "
                  f"{old:#x} -> {new:#x}", symtab.offset + 24 * j + off, width)
    for _ in range(plan["elf_nvinfo"]):
        c = rng.choice(cubins)
        v = views[c]
        rec, val, size = rng.choice(v.nvinfo_records())
        where = rng.choice(["format", "attribute", "size", "value"])
        if where == "format":
            at, width = rec, 1
        elif where == "attribute":
            at, width = rec + 1, 1
        elif where == "size":
            at, width = rec + 2, 2
        else:
            width = rng.choice([w for w in (1, 2, 4) if w <= max(size, 1)])
            at = val + rng.randrange(max(size - width + 1, 1))
        add_field("elf_nvinfo", c, v,
                  lambda old, new: f".nv.info record at {rec:#x} {where} {old:#x} -> {new:#x}",
                  at, width)
    for _ in range(plan["elf_bytes"]):
        c = rng.choice(cubins)
        v = views[c]
        ops = []
        for _ in range(rng.randint(1, 4)):
            lo, hi = rng.choice(v.regions())
            ops.append(_patch(c, rng.randrange(lo, hi), rng.getrandbits(8), 1))
        add("elf_bytes", f"{c}: {len(ops)} byte(s) of its header tables",
            ops + [{"op": "rehash", "file": c}])
    for _ in range(plan["elf_truncate"]):
        c = rng.choice(cubins)
        n = rng.randrange(len(views[c].data))
        add("elf_truncate", f"{c}: cut to {n} bytes",
            [{"op": "truncate", "file": c, "size": n}, {"op": "rehash", "file": c}])
    fields = ["key", "kernel", "name", "entry", "cubin", "sha256", "target", "target/backend",
              "target/arch", "target/warp_size", "triton_version", "num_warps", "num_ctas",
              "num_stages", "shared_mem", "arg_names", "signature", "signature/0",
              "constexprs", "num_params", "num_trailing_scratch_ptrs", "global_scratch_size",
              "global_scratch_align", "profile_scratch_size", "profile_scratch_align"]
    for _ in range(plan["manifest_field"]):
        i = rng.randrange(len(man["kernels"]))
        field = rng.choice(fields + [f"constexprs/{k}" for k in man["kernels"][i]["constexprs"]])
        if rng.random() < 0.15:
            op = {"op": "json", "path": f"/kernels/{i}/{field}", "remove": True}
            what = f"kernels[{i}].{field} removed"
        else:
            value = rng.choice(BAD_VALUES)
            op = {"op": "json", "path": f"/kernels/{i}/{field}", "value": value}
            what = f"kernels[{i}].{field} = {json.dumps(value)[:40]}"
        add("manifest_field", what, [op])
    for _ in range(plan["manifest_text"]):
        ops = []
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(raw))
            kind = rng.randrange(3)
            if kind == 0:
                ops.append({"op": "splice", "file": "manifest.json", "offset": pos, "delete": 0,
                            "hex": rng.choice(TOKENS).hex()})
            elif kind == 1:
                ops.append({"op": "splice", "file": "manifest.json", "offset": pos, "delete": 1,
                            "hex": bytes([rng.getrandbits(8)]).hex()})
            else:
                ops.append({"op": "splice", "file": "manifest.json", "offset": pos,
                            "delete": rng.randint(1, 32), "hex": ""})
        add("manifest_text", f"{len(ops)} edit(s) of the text", ops)
    n_k = len(man["kernels"])
    for _ in range(plan["keys"]):
        a, b = rng.sample(range(n_k), 2)
        kind = rng.choice(["swap_keys", "swap_cubins", "swap_entries", "constexpr", "warps"])
        ka, kb = man["kernels"][a], man["kernels"][b]
        if kind == "swap_keys":
            ops = [{"op": "json", "path": f"/kernels/{a}/key", "value": kb["key"]},
                   {"op": "json", "path": f"/kernels/{b}/key", "value": ka["key"]}]
        elif kind == "swap_cubins":
            ops = [{"op": "json", "path": f"/kernels/{a}/cubin", "value": kb["cubin"]},
                   {"op": "json", "path": f"/kernels/{a}/sha256", "value": kb["sha256"]},
                   {"op": "json", "path": f"/kernels/{b}/cubin", "value": ka["cubin"]},
                   {"op": "json", "path": f"/kernels/{b}/sha256", "value": ka["sha256"]}]
        elif kind == "swap_entries":  # a reordering: a good bundle
            ops = [{"op": "json", "path": f"/kernels/{a}", "value": kb},
                   {"op": "json", "path": f"/kernels/{b}", "value": ka}]
        elif kind == "constexpr":
            name = rng.choice(sorted(ka["constexprs"]))
            ops = [{"op": "json", "path": f"/kernels/{a}/constexprs/{name}",
                    "value": ka["constexprs"][name] + rng.choice([1, -1, 1024])}]
        else:
            ops = [{"op": "json", "path": f"/kernels/{a}/num_warps",
                    "value": rng.choice([1, 2, 4, 8, 16, 32])}]
        add("keys", f"{kind} kernels[{a}] / kernels[{b}]", ops)
    file_ops = [
        ("manifest FIFO", lambda c: [{"op": "remove", "file": "manifest.json"},
                                     {"op": "mkfifo", "file": "manifest.json"}]),
        ("manifest -> /dev/zero", lambda c: [{"op": "remove", "file": "manifest.json"},
                                             {"op": "symlink", "file": "manifest.json",
                                              "target": "/dev/zero"}]),
        ("cubin FIFO", lambda c: [{"op": "remove", "file": c}, {"op": "mkfifo", "file": c}]),
        ("cubin -> /dev/zero", lambda c: [{"op": "remove", "file": c},
                                          {"op": "symlink", "file": c, "target": "/dev/zero"}]),
        ("cubin -> /etc/passwd", lambda c: [{"op": "remove", "file": c},
                                            {"op": "symlink", "file": c, "target": "/etc/passwd"}]),
        ("cubin a directory", lambda c: [{"op": "remove", "file": c}, {"op": "mkdir", "file": c}]),
        ("cubin 1 TiB (sparse)", lambda c: [{"op": "truncate", "file": c, "size": 1 << 40}]),
        ("cubin missing", lambda c: [{"op": "remove", "file": c}]),
        ("cubin link loop", lambda c: [{"op": "remove", "file": c},
                                       {"op": "symlink", "file": c, "target": c}]),
        ("manifest 1 TiB (sparse)", lambda c: [{"op": "truncate", "file": "manifest.json",
                                                "size": 1 << 40}]),
    ]
    for _ in range(plan["files"]):
        c = rng.choice(cubins)
        what, make = rng.choice(file_ops)
        add("files", f"{what} ({c})", make(c))
    return out


def apply_ops(ops: List[Dict[str, Any]], folder: str) -> None:
    for op in ops:
        if op["op"] == "splice":
            path = os.path.join(folder, op["file"])
            data = bytearray(open(path, "rb").read())
            at = min(op["offset"], len(data))
            data[at:at + op["delete"]] = bytes.fromhex(op["hex"])
            open(path, "wb").write(bytes(data))
        else:
            try:
                bundle_corpus.apply([op], folder)
            except (KeyError, IndexError, TypeError, ValueError, json.JSONDecodeError):
                pass  # an operation on a manifest an earlier one made unreadable: skipped

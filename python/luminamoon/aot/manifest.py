"""The bundle manifest (format_version 3): the rule book's schema, writer, loader and verifier.

A bundle is a folder: ``manifest.json`` plus one ``.cubin`` (NVIDIA) or ``.hsaco`` (AMD, a HIP
entry; :mod:`.hsaco`) per compiled kernel variant and arch. The C++ runtime (``luminav::AotManifest``) and this module read the same files by the
same rules, in the same order (docs/bundle-format.md, "The rule book"), and refuse a bad bundle
with the same reason code: a :class:`BundleError` that names the file, the field, what was
expected and what was found. Reading never blocks and never reads without bound (:mod:`.files`);
no input makes it raise anything but :class:`BundleError`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ..kernels.keys import KEY_CONSTEXPRS, variant_key as derive_key  # the one writer
from . import compat
from .cubin import CubinError, parse_cubin
from .files import read_bundle_file, read_code_object
from .hsaco import HIP_ARCHS, HIP_WARP_SIZE, check_hsaco
from .manifest_json import parse_manifest_bytes
from .rules import (CODES, MANIFEST_MAX_BYTES, NAME_MAX_BYTES,
                    RULES, BundleError)

__all__ = ["BundleError", "CODES", "RULES", "FORMAT", "FORMAT_VERSION", "check_cubin",
           "derive_key", "find_kernel", "load_bundle", "parse_manifest_bytes", "read_manifest",
           "runs_on", "validate_manifest", "verify_bundle", "write_manifest"]

FORMAT = "luminamoon-aot-bundle"
FORMAT_VERSION = 3  # the newest format_version this reader understands
HIP_MIN_FORMAT_VERSION = 3  # the first format_version with HIP entries
# Columns of the device table that the kernels of a format_version 1 bundle read; from
# version 2 the manifest says it in "table_cols".
V1_TABLE_COLS = 12
MANIFEST_NAME = "manifest.json"
KERNEL_NAMES = ("pass1", "reduce", "pass2", "single_pass", "commit")
MAX_TRAILING_SCRATCH_PTRS = 2
MAX_SCRATCH_BYTES = 1 << 40
MAX_SCRATCH_ALIGN = 1 << 20
MAX_SHARED_MEM = (1 << 31) - 1


# The manifest's type words (docs/bundle-format.md): what the runtime passes by value.
TYPE_WORDS = compat.SCALAR_TYPE_WORDS
_HEX64 = re.compile(r"[0-9a-f]{64}")
_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_VERSION_FORM = re.compile(r"([0-9]{1,4})\.([0-9]{1,4})(?:[.+-][0-9A-Za-z.+_-]*)?")
_VERSION_MAX = 64
_FIX_REBUILD = "rebuild the bundle (luminamoon aot build)"


def expected_cubin_name(key: str, arch: int) -> str:
    return f"{key}.sm{arch}.cubin"


def expected_hsaco_name(key: str, arch: str) -> str:
    return f"{key}.{arch}.hsaco"


def is_hip_entry(entry: Any) -> bool:
    """A HIP entry: its ``target`` an object whose ``backend`` is the string ``"hip"`` (what K1
    looks at before the fifth field, ``hsaco`` in place of ``cubin``)."""
    tgt = entry.get("target") if isinstance(entry, dict) else None
    return isinstance(tgt, dict) and tgt.get("backend") == "hip"


def code_object_file(entry: Mapping[str, Any]) -> str:
    """The file an entry names: its ``hsaco`` (HIP) or its ``cubin`` (CUDA)."""
    return entry["hsaco"] if is_hip_entry(entry) else entry["cubin"]


def is_manifest_type_word(word: Any) -> bool:
    """A type word the runtime passes by value: a scalar word, ``*<word>`` or ``*k<word>``."""
    if not isinstance(word, str):
        return False
    if word.startswith("*k"):
        return word[2:] in TYPE_WORDS
    if word.startswith("*"):
        return word[1:] in TYPE_WORDS
    return word in TYPE_WORDS


def manifest_param_bytes(word: str) -> int:
    return compat.POINTER_BYTES if word.startswith("*") else compat.param_bytes(word)


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list)  # elements are checked one by one (rule K1)


def _is_object(v: Any) -> bool:
    return isinstance(v, dict)


# field -> (check, what the check wants, in words), in the rule book's order
TOP_FIELDS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "format": (_is_str, "a string"),
    "format_version": (_is_int, "an integer"),
    "table_cols": (_is_int, "an integer"),
    "created_by": (_is_str, "a string"),
    "triton_version": (_is_str, "a string"),
    "kernels": (lambda v: isinstance(v, list), "an array"),
}
KERNEL_FIELDS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "key": (_is_str, "a string"),
    "kernel": (_is_str, "a string"),
    "name": (_is_str, "a string"),
    "entry": (_is_str, "a string"),
    "cubin": (_is_str, "a string"),
    "sha256": (_is_str, "a string"),
    "target": (_is_object, "an object"),
    "triton_version": (_is_str, "a string"),
    "num_warps": (_is_int, "an integer"),
    "num_ctas": (_is_int, "an integer"),
    "num_stages": (_is_int, "an integer"),
    "shared_mem": (_is_int, "an integer"),
    "arg_names": (_is_str_list, "an array of strings"),
    "signature": (_is_str_list, "an array of strings"),
    "constexprs": (_is_object, "an object of integers"),
    "num_params": (_is_int, "an integer"),
    "num_trailing_scratch_ptrs": (_is_int, "an integer"),
    "global_scratch_size": (_is_int, "an integer"),
    "global_scratch_align": (_is_int, "an integer"),
    "profile_scratch_size": (_is_int, "an integer"),
    "profile_scratch_align": (_is_int, "an integer"),
}
TARGET_FIELDS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "backend": (_is_str, "a string"),
    "arch": (_is_int, "an integer"),
    "warp_size": (_is_int, "an integer"),
}


def _show(v: Any) -> str:
    text = json.dumps(v)  # ASCII: a surrogate or control character is escaped
    return text if len(text) <= 80 else text[:77] + "..."


def _field(obj: Mapping[str, Any], name: str, check: Callable[[Any], bool], want: str,
           path: str, where: str) -> Any:
    if name not in obj:
        raise BundleError("missing_field", path, where, f"{want} (required)", "nothing",
                          _FIX_REBUILD)
    v = obj[name]
    if not check(v):
        raise BundleError("bad_type", path, where, want, _show(v))
    return v


def _is_version(v: str) -> bool:
    return len(v) <= _VERSION_MAX and _VERSION_FORM.fullmatch(v) is not None


def validate_manifest(manifest: Any, path: str = MANIFEST_NAME) -> None:
    """Refuses (raises :class:`BundleError`) a manifest that breaks rules T1-T8 and K0-K3.

    Checks everything that needs no cubin, in the rule book's order: format and version, every
    field and its type, the values (ranges, type words, names, parameter and scratch counts,
    the derived key), and that no (key, arch) appears twice.
    """
    if not isinstance(manifest, dict):
        raise BundleError("bad_type", path, "(top level)", "a JSON object", _show(manifest))
    fmt = manifest.get("format")
    if fmt != FORMAT or not isinstance(fmt, str):
        raise BundleError("format", path, "format", repr(FORMAT),
                          _show(fmt) if "format" in manifest else "nothing",
                          "this is not a LuminaMoon kernel bundle")
    if "format_version" not in manifest:
        raise BundleError("format_version", path, "format_version",
                          f"an integer in 1..{FORMAT_VERSION}", "nothing")
    version = manifest["format_version"]
    if not _is_int(version):
        raise BundleError("bad_type", path, "format_version", "an integer", _show(version))
    if not 1 <= version <= FORMAT_VERSION:
        raise BundleError("format_version", path, "format_version",
                          f"an integer in 1..{FORMAT_VERSION}", version,
                          "the bundle was written by a newer LuminaMoon; upgrade luminamoon "
                          "or rebuild the bundle with this one" if version > FORMAT_VERSION
                          else _FIX_REBUILD)
    for name, (check, want) in TOP_FIELDS.items():
        if name in ("format", "format_version") or (name == "table_cols" and version < 2):
            continue
        v = _field(manifest, name, check, want, path, name)
        if name == "table_cols" and not 1 <= v <= 4096:
            raise BundleError("bad_value", path, name, "an integer in 1..4096", v)
        if name == "triton_version" and not _is_version(v):
            raise BundleError("bad_value", path, name, "a version such as \"3.6.0\"", _show(v))
        if name == "kernels" and not v:
            raise BundleError("bad_value", path, name, "at least one kernel variant",
                              "an empty array", _FIX_REBUILD)
    seen: Dict[Tuple[str, int], int] = {}
    for i, entry in enumerate(manifest["kernels"]):
        validate_kernel_entry(entry, path, i, version)
        k = (entry["key"], entry["target"]["arch"])
        if k in seen:
            raise BundleError("duplicate", path, f"kernels[{i}]", "one entry per (key, arch)",
                              f"({_show(k[0])}, {k[1]}) again (first at kernels[{seen[k]}])")
        seen[k] = i


def table_cols(manifest: Mapping[str, Any]) -> int:
    """Columns of the device table the bundle's kernels read (12 for format_version 1)."""
    return int(manifest.get("table_cols", V1_TABLE_COLS)) if manifest["format_version"] >= 2 \
        else V1_TABLE_COLS


def validate_kernel_entry(entry: Any, path: str, i: int, version: int = FORMAT_VERSION) -> None:
    """Rules K0-K2 for ``kernels[i]`` of a manifest of ``format_version`` ``version``."""
    p = f"kernels[{i}]."
    if not isinstance(entry, dict):
        raise BundleError("bad_type", path, f"kernels[{i}]", "an object", _show(entry))
    hip = is_hip_entry(entry)
    # K1: every field present with its type, in order (a HIP entry's file is "hsaco")
    for name, (check, want) in KERNEL_FIELDS.items():
        if name == "cubin" and hip:
            name = "hsaco"
        v = _field(entry, name, check, want, path, p + name)
        if name == "target":
            for tname, (tcheck, twant) in TARGET_FIELDS.items():
                if hip and tname == "arch":
                    tcheck, twant = _is_str, "a string"
                _field(v, tname, tcheck, twant, path, f"{p}target.{tname}")
        elif name in ("arg_names", "signature"):
            for j, x in enumerate(v):
                if not isinstance(x, str):
                    raise BundleError("bad_type", path, f"{p}{name}[{j}]", "a string", _show(x))
        elif name == "constexprs":
            for c in sorted(v):
                if not _is_int(v[c]):
                    raise BundleError("bad_type", path, f"{p}constexprs.{c}", "an integer",
                                      _show(v[c]))

    def bad(name: str, expected: Any, code: str = "bad_value", fix: str = "") -> BundleError:
        return BundleError(code, path, p + name, expected, _show(_dig(entry, name)), fix)

    def in_range(name: str, lo: int, hi: int, pow2: bool = False) -> int:
        v = _dig(entry, name)
        if not lo <= v <= hi or (pow2 and v & (v - 1)):
            raise bad(name, f"{'a power of two' if pow2 else 'an integer'} in {lo}..{hi}")
        return v

    # K2: values, in order
    if entry["kernel"] not in KERNEL_NAMES:
        raise bad("kernel", f"one of {', '.join(KERNEL_NAMES)}")
    if not entry["name"]:
        raise bad("name", "a non-empty string")
    if len(entry["entry"]) > NAME_MAX_BYTES or not _IDENTIFIER.fullmatch(entry["entry"]):
        raise bad("entry", "a symbol name ([A-Za-z_$][A-Za-z0-9_$]*, at most 255 bytes)")
    if not _HEX64.fullmatch(entry["sha256"]):
        raise bad("sha256", "64 lowercase hex digits")
    file_field = "hsaco" if hip else "cubin"
    cub = entry[file_field]
    if len(cub) > NAME_MAX_BYTES or not _FILE_NAME.fullmatch(cub):
        raise bad(file_field, "a file name inside the bundle folder (no directories; letters, "
                  "digits, '.', '_', '-'; at most 255 bytes)")
    tgt = entry["target"]
    if tgt["backend"] not in ("cuda", "hip"):
        raise bad("target.backend", '"cuda" or "hip"')
    if hip:
        if version < HIP_MIN_FORMAT_VERSION:
            raise bad("target.backend", f'"cuda" (HIP entries need format_version '
                      f'{HIP_MIN_FORMAT_VERSION} or later; this manifest is {version})',
                      code="hip_target", fix=_FIX_REBUILD)
        if tgt["arch"] not in HIP_ARCHS:
            raise bad("target.arch", f"one of {', '.join(HIP_ARCHS)}", code="hip_target")
        if tgt["warp_size"] != HIP_WARP_SIZE:
            raise bad("target.warp_size", f"{HIP_WARP_SIZE} (an AMD gfx9 wavefront)",
                      code="hip_target")
    else:
        in_range("target.arch", 10, 999)
        if tgt["warp_size"] != 32:
            raise bad("target.warp_size", "32")
    if not _is_version(entry["triton_version"]):
        raise bad("triton_version", 'a version such as "3.6.0"')
    in_range("num_warps", 1, 32, pow2=True)
    in_range("num_ctas", 1, 16)
    in_range("num_stages", 0, 64)
    in_range("shared_mem", 0, MAX_SHARED_MEM)
    sig, names = entry["signature"], entry["arg_names"]
    for j, word in enumerate(sig):
        if not is_manifest_type_word(word):
            raise BundleError("bad_value", path, f"{p}signature[{j}]", "a Triton type word (i1, "
                              "i32, i64, u32, u64, fp16, bf16, fp32, fp64, or a pointer *<word> "
                              "or *k<word>)", _show(word))
    if len(names) != len(sig):
        raise BundleError("num_params", path, p + "arg_names",
                          f"one name per signature entry ({len(sig)})", f"{len(names)} names")
    for c in sorted(entry["constexprs"]):
        if c not in KEY_CONSTEXPRS:
            raise BundleError("bad_value", path, f"{p}constexprs.{c}",
                              f"a constexpr the variant key encodes ({', '.join(KEY_CONSTEXPRS)})",
                              _show(c))
    trailing = in_range("num_trailing_scratch_ptrs", 0, MAX_TRAILING_SCRATCH_PTRS)
    if entry["num_params"] != len(sig) + trailing:
        raise BundleError("num_params", path, p + "num_params",
                          f"len(signature) + num_trailing_scratch_ptrs = {len(sig)} + {trailing} "
                          f"= {len(sig) + trailing}", entry["num_params"],
                          "the manifest disagrees with itself; rebuild the bundle")
    in_range("global_scratch_size", 0, MAX_SCRATCH_BYTES)
    in_range("global_scratch_align", 1, MAX_SCRATCH_ALIGN, pow2=True)
    in_range("profile_scratch_size", 0, MAX_SCRATCH_BYTES)
    in_range("profile_scratch_align", 1, MAX_SCRATCH_ALIGN, pow2=True)
    if entry["global_scratch_size"] > 0 and trailing < 1:
        raise bad("global_scratch_size", "0 (the kernel has no global scratch parameter)",
                  code="scratch")
    if entry["profile_scratch_size"] > 0 and trailing < 2:
        raise bad("profile_scratch_size", "0 (the kernel has no profile scratch parameter)",
                  code="scratch")
    expected = compat.expected_trailing_scratch_ptrs(entry["triton_version"])
    if expected is not None and expected != trailing:
        raise bad("num_trailing_scratch_ptrs",
                  f"{expected} (what Triton {entry['triton_version']} appends)", code="scratch",
                  fix=_FIX_REBUILD)
    key = derive_key(entry["kernel"], entry["constexprs"], entry["num_warps"])
    if entry["key"] != key:
        raise bad("key", f"{json.dumps(key)} (derived from kernel, constexprs and num_warps)",
                  code="key_mismatch", fix="the key does not name this variant; rebuild the "
                  "bundle")
    want_cubin = (expected_hsaco_name if hip else expected_cubin_name)(key, tgt["arch"])
    if cub != want_cubin:
        raise bad(file_field, json.dumps(want_cubin), code="key_mismatch",
                  fix=f"the {file_field} file is not this variant's; rebuild the bundle")


def _dig(entry: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = entry
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------
def manifest_path(bundle_dir: "os.PathLike[str] | str") -> str:
    return os.path.join(os.fspath(bundle_dir), MANIFEST_NAME)


def read_manifest(bundle_dir: "os.PathLike[str] | str") -> Dict[str, Any]:
    """``manifest.json`` of a bundle, read (rules F), parsed (J) and checked against the schema
    (T, K); no cubin is read."""
    path, raw = read_bundle_file(bundle_dir, MANIFEST_NAME, MANIFEST_MAX_BYTES, "(file)")
    manifest = parse_manifest_bytes(raw, path)
    validate_manifest(manifest, path)
    return manifest


def check_cubin(bundle_dir: "os.PathLike[str] | str", entry: Mapping[str, Any], i: int,
                data: Optional[bytes] = None) -> bytes:
    """Rules C1-C6 for the cubin of ``kernels[i]`` (an entry :func:`validate_manifest`
    accepted): the file (F), its ELF structure (E1-E30), its hash, entry symbol, arch,
    parameters and block size; of a HIP entry, rules H1-H9 (:func:`.hsaco.check_hsaco`).
    Returns the file's bytes."""
    if is_hip_entry(entry):
        return check_hsaco(bundle_dir, entry, i, expected_param_layout(entry), data)
    p = f"kernels[{i}]"
    cpath, data = read_code_object(bundle_dir, entry, i, "cubin", "a cubin", data)
    try:
        info = parse_cubin(data)
    except CubinError as exc:
        raise BundleError(exc.code, cpath, f"{p}.cubin", "a whole, well-formed CUDA ELF cubin",
                          str(exc), _FIX_REBUILD) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise BundleError("sha256", cpath, f"{p}.sha256", entry["sha256"], digest,
                          "the cubin was changed or replaced; rebuild the bundle")
    name = entry["entry"]
    syms = info.entry_symbols(name)
    if len(syms) != 1:
        raise BundleError("no_entry_symbol", cpath, f"{p}.entry",
                          f"one global function symbol {name!r} in the cubin",
                          f"{len(syms)} such symbols", _FIX_REBUILD)
    arch = entry["target"]["arch"]
    if info.arch != arch:
        raise BundleError("arch", cpath, f"{p}.target.arch", f"sm_{info.arch} (the cubin's)",
                          f"sm_{arch}", _FIX_REBUILD)
    _check_params(info, syms[0], entry, cpath, p)
    return data


def expected_param_layout(entry: Mapping[str, Any]) -> List[Tuple[int, int]]:
    """(offset, size) of each kernel parameter as the CUDA ABI lays them out: the signature's,
    then one 8-byte pointer per trailing scratch parameter, each aligned to its size."""
    sizes = [manifest_param_bytes(w) for w in entry["signature"]]
    sizes += [compat.POINTER_BYTES] * entry["num_trailing_scratch_ptrs"]
    out, off = [], 0
    for s in sizes:
        off = (off + s - 1) // s * s
        out.append((off, s))
        off += s
    return out


def _check_params(info: Any, sym: Any, entry: Mapping[str, Any], cpath: str, p: str) -> None:
    infos = info.function_info.get(sym.shndx, ())
    if len(infos) != 1:
        raise BundleError("param_mismatch", cpath, f"{p}.num_params",
                          f"one .nv.info section for {entry['entry']}", f"{len(infos)}",
                          _FIX_REBUILD)
    fi = infos[0]
    want = _check_param_records(fi, entry, cpath, p, "")
    end = want[-1][0] + want[-1][1] if want else 0
    if fi.cbank_param_size is not None and fi.cbank_param_size != end:
        raise BundleError("param_mismatch", cpath, f"{p}.signature",
                          f"{end} bytes of parameters", f"{fi.cbank_param_size} in the cubin",
                          _FIX_REBUILD)
    if fi.param_cbank is not None:
        psym, poff, psize = fi.param_cbank
        s = info.symbols[psym]
        bank = info.sections[s.shndx] if 0 < s.shndx < len(info.sections) else None
        if psize != end or bank is None or poff + psize > bank.size:
            raise BundleError("param_mismatch", cpath, f"{p}.signature",
                              f"a parameter bank of {end} bytes inside its section",
                              f"{psize} bytes at {poff} of "
                              f"{bank.size if bank else 'no'} section bytes", _FIX_REBUILD)
    _check_block(fi, entry, cpath, p, "")
    # The Mercury copy of the kernel (sm_100 and later), which the driver may finalize instead
    # of the SASS: its own .nv.merc.nv.info must describe the same parameters and block.
    for msym in info.merc_entry_symbols(entry["entry"]):
        minfos = info.merc_function_info.get(msym.shndx, ())
        if len(minfos) != 1:
            raise BundleError("param_mismatch", cpath, f"{p}.num_params",
                              f"one .nv.merc.nv.info section for {entry['entry']}'s Mercury code",
                              f"{len(minfos)}", _FIX_REBUILD)
        _check_param_records(minfos[0], entry, cpath, p, " (its Mercury copy)")
        _check_block(minfos[0], entry, cpath, p, " (its Mercury copy)")


def _check_param_records(fi: Any, entry: Mapping[str, Any], cpath: str, p: str,
                         where: str) -> List[Tuple[int, int]]:
    params = sorted(fi.params, key=lambda q: q.ordinal)
    want = expected_param_layout(entry)
    if len(params) != len(want):
        raise BundleError("param_mismatch", cpath, f"{p}.num_params",
                          f"{len(params)} (the cubin's own parameter count for "
                          f"{entry['entry']}{where})", entry["num_params"], _FIX_REBUILD)
    if [q.ordinal for q in params] != list(range(len(params))):
        raise BundleError("param_mismatch", cpath, f"{p}.num_params",
                          f"parameter ordinals 0..{len(params) - 1} once each{where}",
                          [q.ordinal for q in params], _FIX_REBUILD)
    got = [(q.offset, q.size) for q in params]
    if got != want:
        raise BundleError("param_mismatch", cpath, f"{p}.signature",
                          f"parameters (offset, size) {got} (the cubin's{where})",
                          f"{want} from the manifest", _FIX_REBUILD)
    return want


def _check_block(fi: Any, entry: Mapping[str, Any], cpath: str, p: str, where: str) -> None:
    threads = entry["num_warps"] * entry["target"]["warp_size"]
    for what, dims in (("required", fi.reqntid), ("maximum", fi.max_threads)):
        if dims is None:
            continue
        block = dims[0] * dims[1] * dims[2]
        if block != threads if what == "required" else block < threads:
            raise BundleError("launch_shape", cpath, f"{p}.num_warps",
                              f"{'' if what == 'required' else 'at most '}{block} threads "
                              f"(the cubin's {what} block {dims[0]}x{dims[1]}x{dims[2]}{where})",
                              f"{threads} (num_warps {entry['num_warps']})", _FIX_REBUILD)


def load_bundle(bundle_dir: "os.PathLike[str] | str") -> Dict[str, Any]:
    """Reads a bundle as the C++ loader does with every cubin checked (``CubinCheck::kNow``);
    raises the first :class:`BundleError`."""
    manifest = read_manifest(bundle_dir)
    for i, entry in enumerate(manifest["kernels"]):
        check_cubin(bundle_dir, entry, i)
    return manifest


def verify_bundle(bundle_dir: "os.PathLike[str] | str") -> Tuple[Optional[Dict[str, Any]],
                                                                  List[BundleError]]:
    """Every problem of a bundle: the first of the manifest, else one per refused cubin.

    Returns ``(manifest or None, problems)``.
    """
    try:
        manifest = read_manifest(bundle_dir)
    except BundleError as exc:
        return None, [exc]
    problems: List[BundleError] = []
    for i, entry in enumerate(manifest["kernels"]):
        try:
            check_cubin(bundle_dir, entry, i)
        except BundleError as exc:
            problems.append(exc)
    return manifest, problems


# --------------------------------------------------------------------------------------------
# Lookup
# --------------------------------------------------------------------------------------------
def runs_on(cubin_arch: "int | str", device_arch: "int | str") -> bool:
    """A cubin for sm_XY runs on a device of the same major X and minor >= Y only; an hsaco
    on its own gfx arch only (``gfx942:sramecc+:xnack-`` counts as ``gfx942``)."""
    if isinstance(cubin_arch, str) or isinstance(device_arch, str):
        return (isinstance(cubin_arch, str) and isinstance(device_arch, str)
                and cubin_arch == device_arch.split(":")[0])
    return cubin_arch // 10 == device_arch // 10 and device_arch % 10 >= cubin_arch % 10


def _arch_name(arch: "int | str") -> str:
    return arch if isinstance(arch, str) else f"sm_{arch}"


def find_kernel(manifest: Mapping[str, Any], key: str, device_arch: "int | str"
                ) -> Dict[str, Any]:
    """The entry of ``key`` a device of ``device_arch`` runs: an NVIDIA compute capability (e.g.
    90: same major, the highest minor not above the device's) or an AMD gfx arch (e.g.
    ``"gfx942"``: that arch). Raises ``BundleError(code="not_found")`` naming what exists."""
    candidates = [e for e in manifest["kernels"] if e["key"] == key]
    usable = [e for e in candidates if runs_on(e["target"]["arch"], device_arch)]
    if usable:
        return max(usable, key=lambda e: str(e["target"]["arch"]).zfill(8))
    have = sorted({_arch_name(e["target"]["arch"]) for e in candidates})
    found = f"archs {', '.join(have)}" if have else "no such key"
    want = device_arch.split(":")[0] if isinstance(device_arch, str) else device_arch
    raise BundleError("not_found", MANIFEST_NAME, f"kernels[key={key!r}]",
                      f"a kernel that runs on {_arch_name(want)}", found,
                      f"rebuild with `luminamoon aot build --arch {want}`")


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------
def atomic_write(path: "os.PathLike[str] | str", data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file in the same folder and a rename,
    so a reader sees the old file or the whole new one, never a part."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def dump_manifest(manifest: Mapping[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=False) + "\n").encode("utf-8")


def write_manifest(bundle_dir: "os.PathLike[str] | str", manifest: Mapping[str, Any]) -> str:
    """Validates ``manifest`` and writes it atomically; returns its path."""
    path = manifest_path(bundle_dir)
    validate_manifest(dict(manifest), path)
    atomic_write(path, dump_manifest(manifest))
    return path

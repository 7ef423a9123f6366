"""The bundle manifest (format_version 2): schema, writer, loader and verifier.

A bundle is a folder: ``manifest.json`` plus one ``.cubin`` per compiled kernel variant and
arch. The C++ runtime (``luminav::AotManifest``) and this module read the same file and refuse
the same things, each with a :class:`BundleError` that names the file, the field, what was
expected and what was found. See docs/bundle-format.md.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from . import compat
from .cubin import CubinError, has_symbol, parse_cubin

FORMAT = "luminamoon-aot-bundle"
FORMAT_VERSION = 2  # the newest format_version this reader understands
# Columns of the device table that the kernels of a format_version 1 bundle read; from
# version 2 the manifest says it in "table_cols".
V1_TABLE_COLS = 12
MANIFEST_NAME = "manifest.json"
KERNEL_NAMES = ("pass1", "reduce", "pass2", "single_pass", "commit")
MAX_TRAILING_SCRATCH_PTRS = 2

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class BundleError(ValueError):
    """A bundle the loader refuses.

    ``code`` says which rule was broken (``bad_json``, ``missing_file``, ``missing_field``,
    ``bad_type``, ``bad_value``, ``format``, ``format_version``, ``num_params``,
    ``duplicate``, ``truncated``, ``sha256``, ``abi``, ``arch``, ``not_found``); ``path`` the
    file, ``field`` the field (``kernels[3].sha256``), ``expected`` / ``found`` the values.
    """

    def __init__(self, code: str, path: str, field: str, expected: Any, found: Any,
                 fix: str = "") -> None:
        self.code, self.path, self.field = code, str(path), field
        self.expected, self.found, self.fix = expected, found, fix
        msg = f"{self.path}: {field}: expected {expected}, found {found}"
        if fix:
            msg += f"; {fix}"
        super().__init__(msg)


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_constexpr_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, int)
                                       for k, x in v.items())


def _is_target(v: Any) -> bool:
    return isinstance(v, dict)


# field -> (check, what the check wants, in words)
TOP_FIELDS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "format": (_is_str, "a string"),
    "format_version": (_is_int, "an integer"),
    "created_by": (_is_str, "a string"),
    "triton_version": (_is_str, "a string"),
    "kernels": (lambda v: isinstance(v, list), "a list"),
}
KERNEL_FIELDS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "key": (_is_str, "a string"),
    "kernel": (_is_str, "a string"),
    "name": (_is_str, "a string"),
    "entry": (_is_str, "a string"),
    "cubin": (_is_str, "a string"),
    "sha256": (_is_str, "a string"),
    "target": (_is_target, "an object"),
    "triton_version": (_is_str, "a string"),
    "num_warps": (_is_int, "an integer"),
    "num_ctas": (_is_int, "an integer"),
    "num_stages": (_is_int, "an integer"),
    "shared_mem": (_is_int, "an integer"),
    "arg_names": (_is_str_list, "a list of strings"),
    "signature": (_is_str_list, "a list of strings"),
    "constexprs": (_is_constexpr_map, "an object of integers"),
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


def is_manifest_type_word(word: str) -> bool:
    """A type word the runtime passes by value: a scalar word, ``*<word>`` or ``*k<word>``."""
    if isinstance(word, str) and word.startswith("*k"):
        return compat.is_type_word("*" + word[2:])
    return compat.is_type_word(word)


def manifest_param_bytes(word: str) -> int:
    return compat.POINTER_BYTES if word.startswith("*") else compat.param_bytes(word)


def _check_fields(obj: Mapping[str, Any], fields: Mapping[str, Tuple[Callable, str]],
                  path: str, prefix: str) -> None:
    for name, (check, want) in fields.items():
        where = f"{prefix}{name}"
        if name not in obj:
            raise BundleError("missing_field", path, where, f"{want} (required)", "nothing",
                              "rebuild the bundle with `luminamoon aot build`")
        if not check(obj[name]):
            raise BundleError("bad_type", path, where, want, _show(obj[name]))


def _show(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, bytes) else repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def validate_manifest(manifest: Any, path: str = MANIFEST_NAME) -> None:
    """Refuses (raises :class:`BundleError`) a manifest that breaks the schema.

    Checks everything that needs no cubin: format and version, every field and its type,
    the values (type words, sizes, alignments, parameter counts), and that no (key, arch)
    appears twice.
    """
    if not isinstance(manifest, dict):
        raise BundleError("bad_type", path, "(top level)", "a JSON object", _show(manifest))
    if "format" not in manifest:
        raise BundleError("format", path, "format", repr(FORMAT), "nothing",
                          "this is not a LuminaMoon kernel bundle")
    if manifest["format"] != FORMAT:
        raise BundleError("format", path, "format", repr(FORMAT), _show(manifest["format"]),
                          "this is not a LuminaMoon kernel bundle")
    version = manifest.get("format_version")
    if version is None:
        raise BundleError("format_version", path, "format_version",
                          f"an integer <= {FORMAT_VERSION}", "nothing")
    if not _is_int(version):
        raise BundleError("bad_type", path, "format_version", "an integer", _show(version))
    if version > FORMAT_VERSION or version < 1:
        raise BundleError("format_version", path, "format_version",
                          f"1..{FORMAT_VERSION}", version,
                          "the bundle was written by a newer LuminaMoon; upgrade luminamoon "
                          "or rebuild the bundle with this one" if version > FORMAT_VERSION
                          else "")
    _check_fields(manifest, TOP_FIELDS, path, "")
    if version >= 2:
        if "table_cols" not in manifest:
            raise BundleError("missing_field", path, "table_cols", "an integer (required)",
                              "nothing", "rebuild the bundle with `luminamoon aot build`")
        if not _is_int(manifest["table_cols"]) or not 1 <= manifest["table_cols"] <= 4096:
            raise BundleError("bad_value", path, "table_cols", "an integer in 1..4096",
                              _show(manifest["table_cols"]))
    seen: Dict[Tuple[str, int], int] = {}
    for i, entry in enumerate(manifest["kernels"]):
        validate_kernel_entry(entry, path, i)
        k = (entry["key"], entry["target"]["arch"])
        if k in seen:
            raise BundleError("duplicate", path, f"kernels[{i}]",
                              "one entry per (key, arch)",
                              f"({k[0]!r}, {k[1]}) again (first at kernels[{seen[k]}])")
        seen[k] = i


def table_cols(manifest: Mapping[str, Any]) -> int:
    """Columns of the device table the bundle's kernels read (12 for format_version 1)."""
    return int(manifest.get("table_cols", V1_TABLE_COLS)) if manifest["format_version"] >= 2 \
        else V1_TABLE_COLS


def validate_kernel_entry(entry: Any, path: str, i: int) -> None:
    p = f"kernels[{i}]."
    if not isinstance(entry, dict):
        raise BundleError("bad_type", path, f"kernels[{i}]", "an object", _show(entry))
    _check_fields(entry, KERNEL_FIELDS, path, p)
    _check_fields(entry["target"], TARGET_FIELDS, path, p + "target.")

    def bad(field: str, expected: Any, fix: str = "", code: str = "bad_value") -> BundleError:
        return BundleError(code, path, p + field, expected, _show(entry[field]) if field in entry
                           else _show(_dig(entry, field)), fix)

    if entry["kernel"] not in KERNEL_NAMES:
        raise bad("kernel", f"one of {', '.join(KERNEL_NAMES)}")
    if not _HEX64.match(entry["sha256"]):
        raise bad("sha256", "64 lowercase hex digits")
    cub = entry["cubin"]
    if not cub or cub != os.path.basename(cub) or cub in (".", "..") or "\\" in cub:
        raise bad("cubin", "a file name inside the bundle folder (no directories)")
    tgt = entry["target"]
    if tgt["backend"] != "cuda":
        raise BundleError("bad_value", path, p + "target.backend", '"cuda"', _show(tgt["backend"]))
    if tgt["arch"] < 10:
        raise BundleError("bad_value", path, p + "target.arch",
                          "a compute capability as major*10+minor (e.g. 90)", tgt["arch"])
    if tgt["warp_size"] != 32:
        raise BundleError("bad_value", path, p + "target.warp_size", 32, tgt["warp_size"])
    for field in ("num_warps", "num_ctas"):
        if entry[field] < 1:
            raise bad(field, "an integer >= 1")
    for field in ("num_stages", "shared_mem", "global_scratch_size", "profile_scratch_size"):
        if entry[field] < 0:
            raise bad(field, "an integer >= 0")
    for field in ("global_scratch_align", "profile_scratch_align"):
        v = entry[field]
        if v < 1 or v & (v - 1):
            raise bad(field, "a power of two >= 1")
    sig, names = entry["signature"], entry["arg_names"]
    for j, word in enumerate(sig):
        if not is_manifest_type_word(word):
            raise BundleError("bad_value", path, f"{p}signature[{j}]",
                              "a Triton type word (i32, i64, u32, u64, fp16, bf16, fp32, fp64, "
                              "i1, or a pointer *<word>)", _show(word))
    if len(names) != len(sig):
        raise BundleError("num_params", path, p + "arg_names",
                          f"one name per signature entry ({len(sig)})", f"{len(names)} names")
    trailing = entry["num_trailing_scratch_ptrs"]
    if not 0 <= trailing <= MAX_TRAILING_SCRATCH_PTRS:
        raise bad("num_trailing_scratch_ptrs", f"0..{MAX_TRAILING_SCRATCH_PTRS}")
    if entry["num_params"] != len(sig) + trailing:
        raise BundleError("num_params", path, p + "num_params",
                          f"len(signature) + num_trailing_scratch_ptrs = {len(sig)} + {trailing} "
                          f"= {len(sig) + trailing}", entry["num_params"],
                          "the manifest disagrees with itself; rebuild the bundle")
    if entry["global_scratch_size"] > 0 and trailing < 1:
        raise bad("global_scratch_size", "0 (the kernel has no global scratch parameter)",
                  code="abi")
    if entry["profile_scratch_size"] > 0 and trailing < 2:
        raise bad("profile_scratch_size", "0 (the kernel has no profile scratch parameter)",
                  code="abi")


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
    """``manifest.json`` of a bundle, parsed and checked against the schema (no cubin read)."""
    path = manifest_path(bundle_dir)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise BundleError("missing_file", path, "(file)", "a bundle manifest", "no such file",
                          "build one with `luminamoon aot build --out "
                          f"{os.fspath(bundle_dir)}`") from None
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError("bad_json", path, "(file)", "valid UTF-8 JSON",
                          f"unparsable text ({exc})") from None
    validate_manifest(manifest, path)
    return manifest


def check_cubin(bundle_dir: "os.PathLike[str] | str", entry: Mapping[str, Any], i: int,
                data: Optional[bytes] = None) -> bytes:
    """Refuses a cubin that is missing, truncated, not the one hashed, or off the manifest's ABI.

    Returns the cubin's bytes.
    """
    cpath = os.path.join(os.fspath(bundle_dir), entry["cubin"])
    p = f"kernels[{i}]"
    if data is None:
        try:
            with open(cpath, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise BundleError("missing_file", cpath, f"{p}.cubin", "the cubin file",
                              "no such file", "rebuild the bundle") from None
    if not data:
        raise BundleError("truncated", cpath, f"{p}.cubin", "a cubin", "an empty file")
    try:
        info = parse_cubin(data)
    except CubinError as exc:
        code = "truncated" if "truncated" in str(exc) else "bad_value"
        raise BundleError(code, cpath, f"{p}.cubin", "a whole CUDA ELF cubin", str(exc),
                          "rebuild the bundle") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise BundleError("sha256", cpath, f"{p}.sha256", entry["sha256"], digest,
                          "the cubin was changed or replaced; rebuild the bundle")
    entry_name = entry["entry"]
    if not has_symbol(data, entry_name):
        raise BundleError("abi", cpath, f"{p}.entry", f"symbol {entry_name!r} in the cubin",
                          "no such symbol")
    arch = entry["target"]["arch"]
    if info.arch is not None and info.arch != arch:
        raise BundleError("arch", cpath, f"{p}.target.arch", f"sm_{info.arch} (the cubin's)",
                          f"sm_{arch}")
    params = info.params.get(entry_name)
    if params is not None:
        if len(params) != entry["num_params"]:
            raise BundleError("num_params", cpath, f"{p}.num_params",
                              f"{len(params)} (the cubin's own parameter count for "
                              f"{entry_name})", entry["num_params"])
        want = [manifest_param_bytes(w) for w in entry["signature"]]
        want += [compat.POINTER_BYTES] * entry["num_trailing_scratch_ptrs"]
        got = [q.size for q in params]
        if got != want:
            raise BundleError("abi", cpath, f"{p}.signature",
                              f"parameter sizes {got} (the cubin's)", f"{want} from the manifest")
    return data


def load_bundle(bundle_dir: "os.PathLike[str] | str") -> Dict[str, Any]:
    """Reads a bundle as the C++ loader does; raises the first :class:`BundleError`."""
    manifest = read_manifest(bundle_dir)
    for i, entry in enumerate(manifest["kernels"]):
        check_cubin(bundle_dir, entry, i)
    return manifest


def verify_bundle(bundle_dir: "os.PathLike[str] | str") -> Tuple[Optional[Dict[str, Any]],
                                                                  List[BundleError]]:
    """Every problem of a bundle (schema problems stop at the first; cubins are each checked).

    Also cross-checks each entry's ``num_trailing_scratch_ptrs`` with the Triton version that
    built it. Returns ``(manifest or None, problems)``.
    """
    try:
        manifest = read_manifest(bundle_dir)
    except BundleError as exc:
        return None, [exc]
    problems: List[BundleError] = []
    path = manifest_path(bundle_dir)
    for i, entry in enumerate(manifest["kernels"]):
        expected = compat.expected_trailing_scratch_ptrs(entry["triton_version"])
        if expected is not None and expected != entry["num_trailing_scratch_ptrs"]:
            problems.append(BundleError(
                "abi", path, f"kernels[{i}].num_trailing_scratch_ptrs",
                f"{expected} (Triton {entry['triton_version']})",
                entry["num_trailing_scratch_ptrs"]))
        try:
            check_cubin(bundle_dir, entry, i)
        except BundleError as exc:
            problems.append(exc)
    return manifest, problems


# --------------------------------------------------------------------------------------------
# Lookup
# --------------------------------------------------------------------------------------------
def runs_on(cubin_arch: int, device_arch: int) -> bool:
    """A cubin for sm_XY runs on a device of the same major X and minor >= Y only."""
    return cubin_arch // 10 == device_arch // 10 and device_arch % 10 >= cubin_arch % 10


def find_kernel(manifest: Mapping[str, Any], key: str, device_arch: int) -> Dict[str, Any]:
    """The entry of ``key`` a device of ``device_arch`` (e.g. 90) runs: same major, the highest
    minor not above the device's. Raises ``BundleError(code="not_found")`` naming what exists."""
    candidates = [e for e in manifest["kernels"] if e["key"] == key]
    usable = [e for e in candidates if runs_on(e["target"]["arch"], device_arch)]
    if usable:
        return max(usable, key=lambda e: e["target"]["arch"])
    have = sorted({e["target"]["arch"] for e in candidates})
    found = (f"archs {', '.join(f'sm_{a}' for a in have)}" if have else "no such key")
    raise BundleError("not_found", MANIFEST_NAME, f"kernels[key={key!r}]",
                      f"a cubin that runs on sm_{device_arch}", found,
                      f"rebuild with `luminamoon aot build --arch {device_arch}`")


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

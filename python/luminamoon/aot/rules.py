"""The bundle rule book's reason codes, the limits every reader applies, and ``BundleError``.

docs/bundle-format.md ("The rule book") lists each rule with its code; the C++ loader has the
same table (optimizer/luminav-triton-aot/src/aot/bundle_rules.cpp), exposed to Python as
``luminamoon._luminav.BUNDLE_RULES`` and compared with this one by tests/test_bundle_rules.py.
A code is stable: tools and tests match on it, never on the message.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

# (code, what it refuses), in the order the rule book checks them.
RULES: Tuple[Tuple[str, str], ...] = (
    # files
    ("missing_file", "manifest.json or a cubin the manifest names does not exist"),
    ("not_regular_file", "a FIFO, socket, device or directory, or a symbolic link that leaves "
                         "the bundle folder"),
    ("too_large", "manifest.json over 16 MiB or a cubin (hsaco) over 64 MiB"),
    ("unreadable", "the file exists but cannot be opened or read"),
    # the manifest
    ("bad_json", "not UTF-8 JSON of the manifest profile: a byte-order mark, invalid UTF-8, "
                 "a lone surrogate, a duplicate object key, nesting deeper than 16, a number "
                 "that is not an integer in the int64 range"),
    ("bad_type", "the top level is not an object, or a field has the wrong JSON type (a "
                 "boolean is not an integer)"),
    ("format", "format missing or not \"luminamoon-aot-bundle\""),
    ("format_version", "format_version missing, below 1, or newer than the reader knows"),
    ("missing_field", "a required field is missing"),
    ("bad_value", "a field's value is outside its range or form"),
    ("hip_target", "a HIP entry's target: backend \"hip\" below format_version 3, an arch not "
                   "one of gfx90a, gfx942, gfx950, or a warp_size other than 64"),
    ("num_params", "num_params != len(signature) + num_trailing_scratch_ptrs, or arg_names and "
                   "signature of different lengths"),
    ("scratch", "a scratch size without its trailing pointer, or a trailing pointer count "
                "other than the one the entry's Triton version appends"),
    ("key_mismatch", "key is not the one derived from kernel, constexprs and num_warps, or "
                     "cubin is not <key>.sm<arch>.cubin (hsaco not <key>.<arch>.hsaco)"),
    ("duplicate", "the same (key, arch) twice"),
    # the cubins
    ("truncated", "a cubin empty or cut short: its header, header tables, a section or a "
                  "segment reach past the end of the file"),
    ("elf_header", "a cubin whose ELF header is not that of a CUDA ELF64 executable"),
    ("elf_section", "a cubin whose section table, string tables, symbols, relocations or "
                    ".nv.info records are malformed or out of bounds"),
    ("hsaco_note", "an hsaco without exactly one NT_AMDGPU_METADATA note, or one whose msgpack "
                   "is not the metadata map"),
    ("sha256", "a cubin whose SHA-256 differs from the manifest's"),
    ("no_entry_symbol", "the manifest's entry is not a global function symbol of the cubin"),
    ("arch", "the cubin's own SM arch (ELF e_flags) differs from target.arch"),
    ("wavefront_size", "the hsaco kernel's .wavefront_size differs from target.warp_size"),
    ("param_mismatch", "the kernel's parameters in .nv.info differ from the signature plus "
                       "the trailing scratch pointers (count, sizes or layout)"),
    ("launch_shape", "the kernel's required block size (.nv.info) differs from "
                     "num_warps * warp_size"),
)
CODES: Tuple[str, ...] = tuple(code for code, _ in RULES)

# Codes raised outside the bundle rule book: a lookup (not a refusal of the bundle), and the C++
# runtime's checks at load on a device (a cubin the device cannot run, more threads or shared
# memory than it allows, a parameter list the driver reports differently), which reach Python
# through the native module.
LOOKUP_CODES = ("not_found", "device")

MANIFEST_MAX_BYTES = 16 << 20
CUBIN_MAX_BYTES = 64 << 20
JSON_MAX_DEPTH = 16  # the manifest's own depth is 4 (top, kernels, an entry, its target)
NAME_MAX_BYTES = 255  # entry, cubin and key strings


class BundleError(ValueError):
    """A bundle the loader refuses.

    ``code`` is the rule broken (:data:`CODES`, or ``not_found`` from a lookup); ``path`` the
    file at fault, ``field`` the field (``kernels[3].sha256``, ``(file)``, ``(top level)``),
    ``expected`` / ``found`` the values, ``fix`` what to do about it.
    """

    def __init__(self, code: str, path: str, field: str, expected: Any, found: Any,
                 fix: str = "", *, message: Optional[str] = None) -> None:
        if code not in CODES and code not in LOOKUP_CODES:
            raise AssertionError(f"unknown bundle rule code {code!r}")
        self.code, self.path, self.field = code, str(path), field
        self.expected, self.found, self.fix = expected, found, fix
        if message is None:  # the native module passes the C++ loader's own message
            message = f"{self.path}: {field}: expected {expected}, found {found}"
            if fix:
                message += f"; {fix}"
            message += f" [{code}]"
        super().__init__(message)

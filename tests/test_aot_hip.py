"""AMD (HIP) bundles, built here with no GPU: the code objects Triton writes for gfx942 and
gfx90a, checked against their manifest entries by an independent reader of the
NT_AMDGPU_METADATA note (this file's own ELF walk and ``msgpack.unpackb``, not
``luminamoon.aot.hsaco``), a bundle that mixes CUDA and HIP entries, and the loader's refusals
(rules H1-H9 and ``hip_target``, docs/bundle-format.md) with the file and field at fault.

No AMD GPU runs anything here: what is tested is what compiles, what loads and what a launcher
would be handed.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import time
from pathlib import Path

import pytest

from conftest import import_or_skip, requires_compiled_triton, skip_because

triton_mod = import_or_skip("triton")
msgpack = import_or_skip("msgpack")

from luminamoon.aot import builder, cli, compat, manifest as mf  # noqa: E402

pytestmark = [pytest.mark.triton, *requires_compiled_triton]
MACH = {"gfx90a": 0x3F, "gfx942": 0x4C, "gfx950": 0x4F}


def _native_with_hsaco():
    """The compiled module where its loader knows HIP entries (has_hip_runtime exists), else
    None: its load_manifest is the C++ loader, which must judge every bundle here alike."""
    try:
        from luminamoon import _luminav
    except ImportError:
        return None
    return _luminav if hasattr(_luminav, "has_hip_runtime") else None


NATIVE = _native_with_hsaco()


def _link_problem():
    """Why this Triton cannot link an AMD code object here (3.0-3.4 without a suitable
    ld.lld), or None."""
    try:
        compat.find_hip_lld(compat.triton_version())
    except compat.TritonCompatError as exc:
        return str(exc)
    return None


LINK_PROBLEM = _link_problem()


# ---------------------------------------------------------------------------------------------
# The independent reader: section headers, notes, msgpack
# ---------------------------------------------------------------------------------------------
def note_metadata(data: bytes) -> tuple:
    """(e_flags, the msgpack map of the one NT_AMDGPU_METADATA note, .dynsym names)."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    assert struct.unpack_from("<H", data, 18)[0] == 224  # EM_AMDGPU
    e_flags = struct.unpack_from("<I", data, 48)[0]
    shoff = struct.unpack_from("<Q", data, 40)[0]
    shnum = struct.unpack_from("<H", data, 60)[0]
    shdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]
    found, names = [], []
    for _n, typ, _f, _a, off, size, link, _i, _al, _es in shdrs:
        if typ == 7:  # SHT_NOTE
            p = off
            while p < off + size:
                namesz, descsz, ntype = struct.unpack_from("<III", data, p)
                owner = data[p + 12:p + 12 + namesz]
                desc = p + 12 + ((namesz + 3) & ~3)
                if owner == b"AMDGPU\x00" and ntype == 32:
                    found.append(msgpack.unpackb(data[desc:desc + descsz], raw=False))
                p = desc + ((descsz + 3) & ~3)
        elif typ == 11:  # SHT_DYNSYM
            stroff = shdrs[link][4]
            for j in range(size // 24):
                st_name = struct.unpack_from("<I", data, off + 24 * j)[0]
                names.append(data[stroff + st_name:data.index(b"\x00", stroff + st_name)].decode())
    assert len(found) == 1
    return e_flags, found[0], names


def check_against_note(folder: Path, entry: dict) -> None:
    data = (folder / entry["hsaco"]).read_bytes()
    e_flags, meta, dynsym = note_metadata(data)
    assert e_flags & 0xFF == MACH[entry["target"]["arch"]]
    kernels = [k for k in meta["amdhsa.kernels"] if k[".name"] == entry["entry"]]
    assert len(kernels) == 1, meta["amdhsa.kernels"]
    k = kernels[0]
    assert k[".symbol"] == entry["entry"] + ".kd" and k[".symbol"] in dynsym
    assert k[".wavefront_size"] == entry["target"]["warp_size"] == 64
    explicit = [a for a in k[".args"] if not a[".value_kind"].startswith("hidden_")]
    assert len(explicit) == entry["num_params"] == \
        len(entry["signature"]) + entry["num_trailing_scratch_ptrs"]
    # pointers (and the trailing scratch pointers) are 8-byte global buffers; scalars by value
    words = entry["signature"] + ["*i8"] * entry["num_trailing_scratch_ptrs"]
    for a, word in zip(explicit, words):
        if word.startswith("*"):
            assert (a[".value_kind"], a[".size"]) == ("global_buffer", 8), (a, word)
        else:
            assert (a[".value_kind"], a[".size"]) == ("by_value", compat.param_bytes(word))
    assert k[".max_flat_workgroup_size"] >= entry["num_warps"] * 64
    assert entry["num_trailing_scratch_ptrs"] == \
        compat.expected_trailing_scratch_ptrs(entry["triton_version"])


# ---------------------------------------------------------------------------------------------
# A mixed bundle: one variant of each kernel, for gfx942 and sm_90
# ---------------------------------------------------------------------------------------------
def _one_of_each_kernel():
    import torch
    from luminamoon.kernels import catalog

    picked = {}
    for v in catalog.all_variants([(torch.float32,) * 3]):
        picked.setdefault(v.kernel, v)
    return list(picked.values())


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    if LINK_PROBLEM:
        skip_because("no hip linker", LINK_PROBLEM)
    out = tmp_path_factory.mktemp("mixed")
    man = builder.build_bundle(out, archs=("gfx942", 90), variants=_one_of_each_kernel(),
                               jobs=2, progress=False)
    return out, man


@pytest.fixture
def bundle(mixed, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(mixed[0], dst)
    return dst


def test_mixed_bundle_has_both_backends_and_every_code_object_matches_its_note(mixed):
    out, man = mixed
    assert man["format_version"] == 3
    hip = [e for e in man["kernels"] if e["target"]["backend"] == "hip"]
    cuda = [e for e in man["kernels"] if e["target"]["backend"] == "cuda"]
    assert len(hip) == len(cuda) == 5
    for e in hip:
        assert e["target"] == {"backend": "hip", "arch": "gfx942", "warp_size": 64}
        assert e["hsaco"] == f"{e['key']}.gfx942.hsaco" and "cubin" not in e
        check_against_note(out, e)
    for e in cuda:
        assert e["cubin"] == f"{e['key']}.sm90.cubin" and "hsaco" not in e
    # the same keys for both archs, and find_kernel picks the entry by key and device
    assert sorted(e["key"] for e in hip) == sorted(e["key"] for e in cuda)
    loaded = mf.load_bundle(out)
    if NATIVE is not None:  # the C++ loader accepts it too, every code object checked
        NATIVE.load_manifest(str(out))
    key = hip[0]["key"]
    assert mf.find_kernel(loaded, key, "gfx942:sramecc+:xnack-")["hsaco"] == hip[0]["hsaco"]
    assert mf.find_kernel(loaded, key, 90)["cubin"] == f"{key}.sm90.cubin"
    with pytest.raises(mf.BundleError, match=r"archs gfx942, sm_90.*--arch gfx90a") as err:
        mf.find_kernel(loaded, key, "gfx90a")
    assert err.value.code == "not_found"


def test_cli_verify_and_inspect_name_the_hsacos(mixed, capsys):
    out, man = mixed
    assert cli.main(["verify", str(out)]) == 0
    assert "10 kernel(s) for gfx942, sm_90" in capsys.readouterr().out
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "format luminamoon-aot-bundle v3" in text
    for e in man["kernels"]:
        size = os.path.getsize(out / mf.code_object_file(e))
        arch = e["target"]["arch"]
        row = next(line for line in text.splitlines()
                   if line.startswith(e["key"] + " ") and f" {arch if isinstance(arch, str) else f'sm_{arch}'} " in line)
        assert row.split()[-2:] == ["hsaco" if isinstance(arch, str) else "cubin", str(size)]


def test_hsaco_is_the_jit_kernel_without_buffer_ops(mixed, monkeypatch):
    """What the JIT compiles for gfx942 (its own binder, aligned pointers, integer scalars
    equal to 1) is the bundle's code object, byte for byte: same signature, same
    specialisation, same options (none that only NVIDIA has) -- with Triton's AMD buffer-op
    specialisation off (AMDGCN_USE_BUFFER_OPS=0). With it on, the JIT also marks a pointer
    whose storage is at most 2 GiB ``tt.pointer_range 32``, which the builder does not promise
    (docs/amd.md); the two then differ in how they address those buffers."""
    from test_aot_builder import _jit_compile, _launch_args

    amd = getattr(getattr(triton_mod, "knobs", None), "amd", None)
    if amd is None or not hasattr(amd, "use_buffer_ops"):
        skip_because("no buffer-op knob")
    monkeypatch.setattr(amd, "use_buffer_ops", False)
    out, man = mixed
    by_key = {v.key(): v for v in _one_of_each_kernel()}
    for e in man["kernels"]:
        if e["target"]["backend"] != "hip":
            continue
        v = by_key[e["key"]]
        plan = builder.plan_kernel(v.spec)
        extra = {k: x for k, x in builder.compile_options(plan, v, hip=True).items()
                 if k not in ("num_warps", "num_stages", "num_ctas")}
        sig, compiled = _jit_compile(plan.fn, _launch_args(plan.runtime_args), e["constexprs"],
                                     v.num_warps, v.num_stages, "gfx942", tuple(extra.items()))
        assert [n for n, t in sig.items() if t != "constexpr"] == e["arg_names"]
        assert bytes(compiled.asm["hsaco"]) == (out / e["hsaco"]).read_bytes(), e["key"]


@pytest.mark.parametrize("text, want", [
    ("90,gfx942", [("cuda", 90), ("hip", "gfx942")]),
    ("sm_80, cuda:90 ,hip:gfx90a,GFX950", [("cuda", 80), ("cuda", 90), ("hip", "gfx90a"),
                                            ("hip", "gfx950")]),
])
def test_arch_list_parses_both_backends(text, want):
    assert [(t.backend, t.arch) for t in cli.parse_archs(text)] == want
    assert [t.warp_size for t in cli.parse_archs(text)] == [32 if b == "cuda" else 64
                                                            for b, _ in want]


@pytest.mark.parametrize("bad", ["gfx1100", "hip:90", "cuda:gfx942", "sm_x"])
def test_cli_build_refuses_an_unknown_arch_naming_it(bad, tmp_path, capsys):
    assert cli.main(["build", "--arch", f"90,{bad}", "--out", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert repr(bad) in err and "gfx90a, gfx942, gfx950" in err and "sm_90" in err
    assert not (tmp_path / "b").exists()


def test_hip_compile_leaves_out_nvidia_only_options():
    from luminamoon.kernels.catalog import Variant

    v = _one_of_each_kernel()[0]
    capped = Variant(v.kernel, v.constexprs, v.num_warps, v.num_stages, maxnreg=128)
    plan = builder.plan_kernel(capped.spec)
    assert builder.compile_options(plan, capped)["maxnreg"] == 128
    hip = builder.compile_options(plan, capped, hip=True)
    assert "maxnreg" not in hip and hip["enable_fp_fusion"] is False
    assert hip["num_warps"] == v.num_warps


# ---------------------------------------------------------------------------------------------
# Triton 3.0-3.4's external linker
# ---------------------------------------------------------------------------------------------
def _exe(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_lld_is_found_or_named(tmp_path):
    assert compat.find_hip_lld("3.6.0") is None  # links inside the wheel
    old, new = _exe(tmp_path / "llvm-14/bin/ld.lld"), _exe(tmp_path / "llvm-19/bin/ld.lld")
    assert compat.find_hip_lld("3.4.0", environ={}, candidates=[old, new]) == new
    assert compat.find_hip_lld("3.1.0", environ={}, candidates=[old]) == old
    with pytest.raises(compat.TritonCompatError, match=r"LLVM 19 or later.*lld-19"):
        compat.find_hip_lld("3.3.0", environ={}, candidates=[old])
    with pytest.raises(compat.TritonCompatError,
                       match=r"none was found; set TRITON_HIP_LLD_PATH.*lld-14"):
        compat.find_hip_lld("3.2.0", environ={}, candidates=[str(tmp_path / "nothing")])
    given = {"TRITON_HIP_LLD_PATH": old}
    assert compat.find_hip_lld("3.4.0", environ=given, candidates=[]) == old
    with pytest.raises(compat.TritonCompatError, match=r"TRITON_HIP_LLD_PATH='/nope'"):
        compat.find_hip_lld("3.4.0", environ={"TRITON_HIP_LLD_PATH": "/nope"})


# ---------------------------------------------------------------------------------------------
# Refusals, each with the file and the field
# ---------------------------------------------------------------------------------------------
def _hip_index(b: Path) -> int:
    man = json.loads((b / "manifest.json").read_text())
    return next(i for i, e in enumerate(man["kernels"]) if e["target"]["backend"] == "hip")


def _edit(b: Path, fn) -> None:
    man = json.loads((b / "manifest.json").read_text())
    fn(man["kernels"][_hip_index(b)], man)
    (b / "manifest.json").write_text(json.dumps(man))


def _rehash(b: Path, name: str) -> None:
    import hashlib

    digest = hashlib.sha256((b / name).read_bytes()).hexdigest()
    _edit(b, lambda e, m: e.__setitem__("sha256", digest))


def _refusal(b: Path) -> mf.BundleError:
    with pytest.raises(mf.BundleError) as err:
        mf.load_bundle(b)
    problems = mf.verify_bundle(b)[1]
    assert problems and problems[0].code == err.value.code
    if NATIVE is not None:  # the C++ loader refuses it with the same code and field
        with pytest.raises(mf.BundleError) as cpp:
            NATIVE.load_manifest(str(b))
        assert (cpp.value.code, cpp.value.field) == (err.value.code, err.value.field), \
            str(cpp.value)
    return err.value


def _patch_file(b: Path, fn) -> str:
    i = _hip_index(b)
    name = json.loads((b / "manifest.json").read_text())["kernels"][i]["hsaco"]
    path = b / name
    path.write_bytes(fn(path.read_bytes()))
    return name


def _replace_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1 and len(old) == len(new)
    return data.replace(old, new)


def _assert(err, code, field, b, name=None):
    assert err.code == code, str(err)
    assert err.field == f"kernels[{_hip_index(b)}].{field}", str(err)
    if name:
        assert str(b / name) in str(err) and f"[{code}]" in str(err)


def test_corrupt_elf(bundle):
    name = _patch_file(bundle, lambda d: d[:200])
    _assert(_refusal(bundle), "truncated", "hsaco", bundle, name)
    _patch_file(bundle, lambda d: b"\x7fELF\x01" + d[5:] + b"\x00" * 4096)
    _assert(_refusal(bundle), "elf_header", "hsaco", bundle, name)


def test_wrong_note_type(bundle):
    def retype(d):
        _, meta, _ = note_metadata(d)
        at = d.index(b"AMDGPU\x00") - 4  # the type word before the owner of the metadata note
        assert struct.unpack_from("<I", d, at)[0] == 32
        return d[:at] + struct.pack("<I", 33) + d[at + 4:]
    name = _patch_file(bundle, retype)
    err = _refusal(bundle)
    _assert(err, "hsaco_note", "hsaco", bundle, name)
    assert "0 NT_AMDGPU_METADATA notes" in str(err)


def test_note_that_is_not_msgpack(bundle):
    # amdhsa.kernels renamed: the map no longer has the kernels array
    name = _patch_file(bundle, lambda d: _replace_once(d, b"amdhsa.kernels", b"amdhsa.kernelz"))
    err = _refusal(bundle)
    _assert(err, "hsaco_note", "hsaco", bundle, name)
    assert "amdhsa.kernels" in str(err)


def test_wrong_kernel_name(bundle):
    _edit(bundle, lambda e, m: e.__setitem__("entry", e["entry"] + "_x"))
    err = _refusal(bundle)
    _assert(err, "no_entry_symbol", "entry", bundle)
    assert ".kd" in str(err)


def test_wrong_arg_count(bundle):
    def more(e, m):
        e["signature"].append("i32")
        e["arg_names"].append("extra")
        e["num_params"] += 1
    _edit(bundle, more)
    err = _refusal(bundle)
    _assert(err, "param_mismatch", "num_params", bundle)
    assert "explicit arguments" in str(err) and ".hsaco" in str(err)


def test_wrong_arg_layout(bundle):
    def widen(e, m):  # an i32 argument declared i64: same count, other offsets and sizes
        j = e["signature"].index("i32") if "i32" in e["signature"] else None
        assert j is not None, e["signature"]
        e["signature"][j] = "i64"
    _edit(bundle, widen)
    _assert(_refusal(bundle), "param_mismatch", "signature", bundle)


def test_wrong_arch(bundle):
    # e_flags' low byte says gfx90a; the manifest says gfx942
    name = _patch_file(bundle, lambda d: d[:48] + bytes([0x3F]) + d[49:])
    _rehash(bundle, name)
    err = _refusal(bundle)
    _assert(err, "arch", "target.arch", bundle, name)
    assert "gfx90a" in str(err) and "gfx942" in str(err)


def test_wrong_wavefront_size(bundle):
    # .wavefront_size 64 -> 32 (both msgpack positive fixints: one byte)
    name = _patch_file(bundle, lambda d: _replace_once(d, b"\xaf.wavefront_size\x40",
                                                       b"\xaf.wavefront_size\x20"))
    _rehash(bundle, name)
    err = _refusal(bundle)
    _assert(err, "wavefront_size", "target.warp_size", bundle, name)
    assert "32 (the kernel's .wavefront_size)" in str(err)


def test_hsaco_changed_after_hashing(bundle):
    name = _patch_file(bundle, lambda d: d[:-1] + bytes([d[-1] ^ 1]))
    _assert(_refusal(bundle), "sha256", "sha256", bundle, name)


@pytest.mark.parametrize("edit, code, field", [
    (lambda e, m: e["target"].__setitem__("arch", "gfx1100"), "hip_target", "target.arch"),
    (lambda e, m: e["target"].__setitem__("warp_size", 32), "hip_target", "target.warp_size"),
    (lambda e, m: m.__setitem__("format_version", 2), "hip_target", "target.backend"),
    (lambda e, m: e["target"].__setitem__("arch", 942), "bad_type", "target.arch"),
    (lambda e, m: e.__setitem__("cubin", e.pop("hsaco")), "missing_field", "hsaco"),
    (lambda e, m: e.__setitem__("hsaco", e["hsaco"].replace("gfx942", "gfx90a")),
     "key_mismatch", "hsaco"),
    (lambda e, m: e.__setitem__("hsaco", "../x.hsaco"), "bad_value", "hsaco"),
], ids=["arch", "warp-size", "format-2", "arch-int", "cubin-field", "file-name", "path"])
def test_manifest_refuses_bad_hip_entries(bundle, edit, code, field):
    _edit(bundle, edit)
    err = _refusal(bundle)
    _assert(err, code, field, bundle)
    assert str(bundle / "manifest.json") in str(err)


def test_format_3_is_refused_by_a_reader_of_2(bundle, monkeypatch):
    monkeypatch.setattr(mf, "FORMAT_VERSION", 2)
    monkeypatch.setitem(globals(), "NATIVE", None)  # the C++ loader knows format 3
    err = _refusal(bundle)
    assert err.code == "format_version" and "found 3" in str(err)


# ---------------------------------------------------------------------------------------------
# Every kernel variant for gfx942; for gfx90a the variants of bf16 parameters with float32 and
# q8 moments (every kernel and code path of the catalog, the other dtypes only change loads
# and stores). make test runs it.
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(1800)  # 282 compiles, far longer on a loaded machine
def test_every_variant_compiles_for_gfx942_and_a_gfx90a_subset(tmp_path):
    import torch

    from luminamoon.kernels import catalog
    from luminamoon.kernels.quant import Q8

    if LINK_PROBLEM:
        skip_because("no hip linker", LINK_PROBLEM)
    variants = catalog.all_variants()
    subset = catalog.all_variants([(torch.bfloat16, torch.bfloat16, torch.float32),
                                   (torch.bfloat16, torch.bfloat16, Q8)])
    assert {v.kernel for v in subset} == {v.kernel for v in variants}
    t0 = time.monotonic()
    man = builder.build_bundle(tmp_path / "gfx942", archs=("gfx942",), variants=variants,
                               jobs=max(1, min(2, os.cpu_count() or 1)), progress=False)
    man90 = builder.build_bundle(tmp_path / "gfx90a", archs=("gfx90a",), variants=subset,
                                 jobs=max(1, min(2, os.cpu_count() or 1)), progress=False)
    took = time.monotonic() - t0
    assert len(man["kernels"]) == len(variants) and len(man90["kernels"]) == len(subset)
    for folder, m in ((tmp_path / "gfx942", man), (tmp_path / "gfx90a", man90)):
        assert mf.verify_bundle(folder)[1] == []
        for e in m["kernels"]:
            check_against_note(folder, e)
        if NATIVE is not None:
            NATIVE.load_manifest(str(folder))
    print(f"{len(variants) + len(subset)} code objects in {took:.0f} s")

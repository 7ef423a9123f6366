"""The bundle validator/loader: every refusal the C++ loader makes, each its own clear error.

Each case copies a freshly built (valid) bundle, breaks one thing, and checks the error's code,
the field it names, and that the message carries the expected and found values. Verification
never changes a file of the bundle.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import requires_compiled_triton, require, skip_because

require("triton")

from luminamoon.aot import cli, manifest as mf  # noqa: E402
from luminamoon.aot.cubin import CubinError, parse_cubin  # noqa: E402
from test_aot_builder import build_toy_bundle  # noqa: E402  (tests/ is on sys.path)

pytestmark = [pytest.mark.triton, *requires_compiled_triton]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("pristine")
    build_toy_bundle(out)
    return out


@pytest.fixture
def bundle(pristine, tmp_path):
    out = tmp_path / "bundle"
    shutil.copytree(pristine, out)
    return out


def _manifest(b: Path) -> dict:
    return json.loads((b / "manifest.json").read_text())


def _write(b: Path, man: dict) -> None:
    (b / "manifest.json").write_text(json.dumps(man, indent=2))


def _snapshot(b: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(b.iterdir())}


def _refusal(b: Path) -> mf.BundleError:
    before = _snapshot(b)
    with pytest.raises(mf.BundleError) as info:
        mf.load_bundle(b)
    assert _snapshot(b) == before  # refusing changes nothing
    return info.value


def test_valid_bundle_loads_and_verifies(bundle):
    man = mf.load_bundle(bundle)
    assert man == _manifest(bundle)
    checked, problems = mf.verify_bundle(bundle)
    assert problems == [] and checked == man


# --- the manifest file itself ----------------------------------------------------------------
def test_garbage_json(bundle):
    (bundle / "manifest.json").write_bytes(b'{"format": "luminamoon-aot-bundle", "kern')
    err = _refusal(bundle)
    assert err.code == "bad_json"
    assert "valid UTF-8 JSON" in str(err) and str(bundle / "manifest.json") in str(err)


def test_binary_garbage(bundle):
    (bundle / "manifest.json").write_bytes(os.urandom(64) + b"\xff\xfe")
    assert _refusal(bundle).code == "bad_json"


def test_missing_manifest(bundle):
    (bundle / "manifest.json").unlink()
    err = _refusal(bundle)
    assert err.code == "missing_file" and "luminamoon aot build" in str(err)


def test_top_level_not_an_object(bundle):
    (bundle / "manifest.json").write_text("[1, 2]")
    err = _refusal(bundle)
    assert err.code == "bad_type" and "a JSON object" in str(err)


@pytest.mark.parametrize("value, code, text", [
    pytest.param("luminamoon-aot-bundle-2", "format", "expected 'luminamoon-aot-bundle', "
                 'found "luminamoon-aot-bundle-2"', id="unknown"),
    pytest.param(None, "format", "found nothing", id="missing"),
])
def test_unknown_or_missing_format(bundle, value, code, text):
    man = _manifest(bundle)
    if value is None:
        del man["format"]
    else:
        man["format"] = value
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == code and err.field == "format" and text in str(err)


def test_newer_format_version(bundle):
    man = _manifest(bundle)
    man["format_version"] = mf.FORMAT_VERSION + 1
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "format_version" and err.field == "format_version"
    assert f"found {mf.FORMAT_VERSION + 1}" in str(err) and "newer LuminaMoon" in str(err)


def test_missing_or_mistyped_format_version(bundle):
    man = _manifest(bundle)
    del man["format_version"]
    _write(bundle, man)
    assert _refusal(bundle).code == "format_version"
    man["format_version"] = "1"
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "bad_type" and 'found "1"' in str(err)


def test_table_cols_required_from_version_2_and_implied_by_version_1(bundle):
    man = _manifest(bundle)
    assert mf.table_cols(man) == man["table_cols"]
    del man["table_cols"]
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "missing_field" and err.field == "table_cols"
    for bad, code in (("18", "bad_type"), (0, "bad_value"), (5000, "bad_value")):
        man["table_cols"] = bad
        _write(bundle, man)
        err = _refusal(bundle)
        assert err.code == code and err.field == "table_cols"
    del man["table_cols"]
    man["format_version"] = 1
    _write(bundle, man)
    mf.validate_manifest(_manifest(bundle))
    assert mf.table_cols(man) == mf.V1_TABLE_COLS == 12


@pytest.mark.parametrize("field", sorted(mf.KERNEL_FIELDS))
def test_missing_kernel_field(bundle, field):
    man = _manifest(bundle)
    del man["kernels"][1][field]
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "missing_field"
    assert err.field == f"kernels[1].{field}" and "found nothing" in str(err)


@pytest.mark.parametrize("field", sorted(mf.TOP_FIELDS))
def test_missing_top_field(bundle, field):
    man = _manifest(bundle)
    del man[field]
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.field == field
    assert err.code in ("missing_field", "format", "format_version")


@pytest.mark.parametrize("field, value, code, text, where", [
    pytest.param("num_warps", "8", "bad_type", "expected an integer", "", id="num_warps-str"),
    pytest.param("num_warps", True, "bad_type", "expected an integer", "", id="num_warps-bool"),
    pytest.param("signature", "*i64,i32", "bad_type", "an array of strings", "",
                 id="signature-str"),
    pytest.param("constexprs", {"BLOCK": "256"}, "bad_type", "expected an integer", ".BLOCK",
                 id="constexprs"),
    pytest.param("constexprs", {"BLOCK": True}, "bad_type", "expected an integer", ".BLOCK",
                 id="constexpr-bool"),
    pytest.param("kernel", "pass3", "bad_value", "one of pass1, reduce", "", id="kernel-name"),
    pytest.param("sha256", "ABC", "bad_value", "64 lowercase hex digits", "", id="sha256-form"),
    pytest.param("cubin", "../elsewhere.cubin", "bad_value", "no directories", "",
                 id="cubin-path"),
    pytest.param("num_warps", 0, "bad_value", "a power of two in 1..32", "", id="num_warps-0"),
    pytest.param("num_warps", 3, "bad_value", "a power of two in 1..32", "", id="num_warps-3"),
    pytest.param("num_warps", 64, "bad_value", "a power of two in 1..32", "", id="num_warps-64"),
    pytest.param("num_ctas", 17, "bad_value", "an integer in 1..16", "", id="num_ctas-17"),
    pytest.param("shared_mem", -1, "bad_value", "an integer in 0..", "", id="shared-negative"),
    pytest.param("shared_mem", 2 ** 31, "bad_value", "an integer in 0..2147483647", "",
                 id="shared-2^31"),
    pytest.param("global_scratch_size", 2 ** 41, "bad_value", "an integer in 0..", "",
                 id="scratch-2^41"),
    pytest.param("global_scratch_align", 3, "bad_value", "a power of two", "", id="align"),
    pytest.param("num_trailing_scratch_ptrs", 3, "bad_value", "0..2", "", id="trailing-3"),
    pytest.param("triton_version", "", "bad_value", "a version such as", "",
                 id="triton-version-empty"),
])
def test_mistyped_or_bad_kernel_field(bundle, field, value, code, text, where):
    man = _manifest(bundle)
    man["kernels"][0][field] = value
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == code and err.field == f"kernels[0].{field}{where}"
    shown = json.dumps(value if not where else value[where[1:]])
    assert text in str(err) and shown[:20] in str(err)


def test_empty_kernel_list(bundle):
    man = _manifest(bundle)
    man["kernels"] = []
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "bad_value" and err.field == "kernels"


def test_swapped_keys_are_refused(bundle):
    man = _manifest(bundle)
    a, b = man["kernels"][0], next(e for e in man["kernels"] if e["key"] != man["kernels"][0]["key"]
                                    and e["target"]["arch"] == man["kernels"][0]["target"]["arch"])
    a["key"], b["key"] = b["key"], a["key"]
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "key_mismatch" and err.field == "kernels[0].key"
    assert "derived from kernel, constexprs and num_warps" in str(err)


def test_unknown_type_word(bundle):
    man = _manifest(bundle)
    man["kernels"][0]["signature"][2] = "int32"
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "bad_value" and err.field == "kernels[0].signature[2]"
    assert '"int32"' in str(err)


@pytest.mark.parametrize("delta", [1, -1])
def test_num_params_off_by_one(bundle, delta):
    man = _manifest(bundle)
    e = man["kernels"][0]
    good = e["num_params"]
    e["num_params"] = good + delta
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "num_params" and err.field == "kernels[0].num_params"
    assert f"= {good}" in str(err) and f"found {good + delta}" in str(err)


def test_arg_names_count_off_by_one(bundle):
    man = _manifest(bundle)
    man["kernels"][0]["arg_names"].append("extra")
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "num_params" and err.field == "kernels[0].arg_names"


def test_manifest_consistent_but_cubin_parameter_count_differs(bundle):
    # Dropping one trailing pointer and one param, and naming a Triton that appends one fewer,
    # keeps the manifest self-consistent; the cubin's own parameter list still has the
    # original count.
    man = _manifest(bundle)
    e = man["kernels"][0]
    if e["num_trailing_scratch_ptrs"] == 0:
        skip_because("no scratch pointer")
    e["num_trailing_scratch_ptrs"] -= 1
    e["num_params"] -= 1
    e["triton_version"] = {0: "3.2.0", 1: "3.4.0"}[e["num_trailing_scratch_ptrs"]]
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "param_mismatch" and err.field == "kernels[0].num_params"
    assert f"{e['num_params'] + 1} (the cubin's own parameter count" in str(err)
    _, problems = mf.verify_bundle(bundle)
    assert [p.code for p in problems] == ["param_mismatch"]


def test_trailing_count_wrong_for_the_triton_version(bundle):
    man = _manifest(bundle)
    e = man["kernels"][0]
    e["triton_version"] = "3.2.0" if e["num_trailing_scratch_ptrs"] else "3.6.0"
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "scratch" and err.field == "kernels[0].num_trailing_scratch_ptrs"


def test_signature_size_differs_from_cubin(bundle):
    man = _manifest(bundle)
    sig = man["kernels"][0]["signature"]
    i = sig.index("i64")
    sig[i] = "i32"  # 4 bytes where the kernel takes 8
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "param_mismatch" and err.field == "kernels[0].signature"


def test_scratch_size_without_its_pointer(bundle):
    man = _manifest(bundle)
    e = man["kernels"][0]
    e["num_params"] -= e["num_trailing_scratch_ptrs"]
    e["num_trailing_scratch_ptrs"] = 0
    e["global_scratch_size"] = 64
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "scratch" and err.field == "kernels[0].global_scratch_size"


def test_duplicate_key_and_arch(bundle):
    man = _manifest(bundle)
    man["kernels"].append(copy.deepcopy(man["kernels"][0]))
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "duplicate" and "first at kernels[0]" in str(err)


def test_wrong_target(bundle):
    man = _manifest(bundle)
    man["kernels"][0]["target"]["backend"] = "rocm"
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "bad_value" and err.field == "kernels[0].target.backend"
    # a HIP entry names its code object in "hsaco"; a cubin field does not stand in for it
    man["kernels"][0]["target"]["backend"] = "hip"
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "missing_field" and err.field == "kernels[0].hsaco"
    man["kernels"][0]["target"] = {"backend": "cuda", "arch": 80}
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "missing_field" and err.field == "kernels[0].target.warp_size"


# --- the cubins ------------------------------------------------------------------------------
def _first_cubin(b: Path) -> Path:
    return b / _manifest(b)["kernels"][0]["cubin"]


@pytest.mark.parametrize("keep", [0, 10, 63, 64, 1000, -1])
def test_truncated_cubin(bundle, keep):
    path = _first_cubin(bundle)
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    err = _refusal(bundle)
    assert err.code == "truncated", str(err)
    assert str(path) in str(err) and err.field == "kernels[0].cubin"


def test_wrong_hash(bundle):
    path = _first_cubin(bundle)
    data = bytearray(path.read_bytes())
    info = parse_cubin(bytes(data))
    assert info.size == len(data)
    text = next(s for s in info.sections if s.name.startswith(".text."))
    data[text.offset + text.size // 2] ^= 0xFF  # same length and structure, different bytes
    path.write_bytes(bytes(data))
    err = _refusal(bundle)
    assert err.code == "sha256" and err.field == "kernels[0].sha256"
    assert _manifest(bundle)["kernels"][0]["sha256"] in str(err)
    assert hashlib.sha256(bytes(data)).hexdigest() in str(err)


def test_missing_cubin(bundle):
    path = _first_cubin(bundle)
    path.unlink()
    err = _refusal(bundle)
    assert err.code == "missing_file" and str(path) in str(err)


def test_not_a_cubin(bundle):
    path = _first_cubin(bundle)
    path.write_bytes(b"#!/bin/sh\necho hello\n" * 8)
    err = _refusal(bundle)
    assert err.code == "elf_header" and "ELF magic" in str(err)


def test_entry_symbol_not_in_cubin(bundle):
    man = _manifest(bundle)
    man["kernels"][0]["entry"] = "_some_other_kernel"
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "no_entry_symbol" and "'_some_other_kernel'" in str(err)


def test_cubin_of_another_arch(bundle):
    man = _manifest(bundle)
    a, b = man["kernels"][0], next(e for e in man["kernels"]
                                    if e["key"] == man["kernels"][0]["key"]
                                    and e["target"]["arch"] != man["kernels"][0]["target"]["arch"])
    # the other arch's code in this entry's file, hash updated: sm_90 code under an sm_80 entry
    (bundle / a["cubin"]).write_bytes((bundle / b["cubin"]).read_bytes())
    a["sha256"] = b["sha256"]
    _write(bundle, man)
    err = _refusal(bundle)
    assert err.code == "arch"
    assert f"sm_{b['target']['arch']} (the cubin's)" in str(err)


def test_verify_collects_every_cubin_problem(bundle):
    man = _manifest(bundle)
    p0 = bundle / man["kernels"][0]["cubin"]
    p0.write_bytes(p0.read_bytes()[:100])
    (bundle / man["kernels"][1]["cubin"]).unlink()
    _, problems = mf.verify_bundle(bundle)
    assert [(p.code, p.field) for p in problems] == [("truncated", "kernels[0].cubin"),
                                                     ("missing_file", "kernels[1].cubin")]


def test_verify_cli_reports_each_problem(bundle, capsys):
    man = _manifest(bundle)
    (bundle / man["kernels"][1]["cubin"]).unlink()
    assert cli.main(["verify", str(bundle)]) == 1
    err = capsys.readouterr().err
    assert "[missing_file]" in err and man["kernels"][1]["cubin"] in err
    assert "1 problem(s)" in err


def test_parse_cubin_rejects_short_and_foreign_data():
    with pytest.raises(CubinError, match="truncated"):
        parse_cubin(b"\x7fELF")
    with pytest.raises(CubinError, match="ELF magic"):
        parse_cubin(b"\0" * 128)


# --- lookup by (key, device arch) ------------------------------------------------------------
@pytest.mark.parametrize("cubin_arch, device_arch, runs", [
    (80, 80, True), (80, 86, True), (80, 89, True), (86, 80, False), (80, 90, False),
    (90, 90, True), (90, 80, False), (90, 100, False), (100, 103, True),
])
def test_runs_on(cubin_arch, device_arch, runs):
    assert mf.runs_on(cubin_arch, device_arch) is runs


def test_find_kernel_picks_the_highest_compatible_minor(pristine):
    man = mf.read_manifest(pristine)
    key = man["kernels"][0]["key"]
    assert mf.find_kernel(man, key, 90)["target"]["arch"] == 90
    assert mf.find_kernel(man, key, 86)["target"]["arch"] == 80
    extra = copy.deepcopy(mf.find_kernel(man, key, 80))
    extra["target"]["arch"] = 86
    man["kernels"].append(extra)
    assert mf.find_kernel(man, key, 89)["target"]["arch"] == 86
    assert mf.find_kernel(man, key, 85)["target"]["arch"] == 80
    with pytest.raises(mf.BundleError, match=r"runs on sm_75.*sm_80, sm_86, sm_90.*--arch 75"):
        mf.find_kernel(man, key, 75)
    with pytest.raises(mf.BundleError, match=r"no such key"):
        mf.find_kernel(man, "pass9.w4", 90)


# --- writing ---------------------------------------------------------------------------------
def test_write_manifest_refuses_an_invalid_one_and_keeps_the_old(bundle):
    before = (bundle / "manifest.json").read_bytes()
    man = _manifest(bundle)
    man["kernels"][0]["num_params"] += 1
    with pytest.raises(mf.BundleError, match="num_params"):
        mf.write_manifest(bundle, man)
    assert (bundle / "manifest.json").read_bytes() == before


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    mf.atomic_write(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert os.listdir(tmp_path) == ["x.bin"]
    with pytest.raises(IsADirectoryError):
        mf.atomic_write(tmp_path, b"x")  # a folder cannot be replaced by a file
    assert sorted(os.listdir(tmp_path)) == ["x.bin"]

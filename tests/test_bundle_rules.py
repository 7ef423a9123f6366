"""The bundle rule book, one in both languages (docs/bundle-format.md, "The rule book").

- The reason-code tables of Python (luminamoon.aot.rules) and C++ (aot/bundle_rules.h, through
  ``_luminav.BUNDLE_RULES``) are the same, and each code is in the document's table.
- The shared corpus (tests/data/bundles): every bad bundle is refused with the same code and
  field by the Python tooling (``load_bundle``, ``verify_bundle``, ``luminamoon aot verify``) and
  by the C++ loader (the native module's ``load_manifest``; the GoogleTest
  test_bundle_corpus.cpp runs the same cases without Python); both accept the good ones.
- The key is derived: the rule book's derivation is kernels.catalog's ``Variant.key()`` for every
  shipped variant, and the builder refuses a variant whose key is not the derived one.
- Mutation tests (Hypothesis): random edits of the manifest text, of its values, and of a cubin's
  header and tables (an sm_90 one, and an sm_100 one with its notes, .nv.compat and Mercury
  copy; rehashed, so the ELF reader is what judges them) make every reader raise
  :class:`BundleError` and nothing else, and the two languages the same code and field.

Which finding of the issue "Bundles that cannot hurt" each case covers is its ``finding`` in
cases.json; the tests below name theirs in their docstrings.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

import pytest

import bundle_corpus as bc
from conftest import import_or_skip, needs, require
from luminamoon.aot import cli, manifest as mf
from luminamoon.aot.rules import CODES, LOOKUP_CODES, RULES, BundleError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = bc.load_cases()


def _native():
    try:
        from luminamoon import _luminav
    except ImportError:
        return None
    return _luminav


NATIVE = _native()
needs_native = needs("native")


def _outcome(fn, folder):
    """(code, field) of the refusal, or (None, None) for an accepted bundle."""
    try:
        fn(folder)
    except BundleError as exc:
        return exc.code, exc.field
    return None, None


# --------------------------------------------------------------------------------------------
# One table
# --------------------------------------------------------------------------------------------
def test_codes_are_unique_and_documented():
    assert len(set(CODES)) == len(CODES)
    doc = open(os.path.join(ROOT, "docs", "bundle-format.md")).read()
    book = doc[doc.index("## The rule book"):]
    for code in CODES + LOOKUP_CODES:
        assert f"`{code}`" in book, f"docs/bundle-format.md's rule book lacks the code {code!r}"


@needs_native
def test_python_and_cpp_have_the_same_codes_in_the_same_order():
    cpp = [code for code, _ in NATIVE.BUNDLE_RULES]
    assert cpp[:len(CODES)] == list(CODES)
    assert cpp[len(CODES):] == ["device"]  # the runtime's checks at load on a device
    assert dict(NATIVE.BUNDLE_RULES)["sha256"] == dict(RULES)["sha256"]


# --------------------------------------------------------------------------------------------
# The shared corpus
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_corpus_python(case, tmp_path):
    folder = bc.materialise(case, str(tmp_path / "b"))
    want = (case["code"], case["field"])
    assert _outcome(mf.load_bundle, folder) == want
    manifest, problems = mf.verify_bundle(folder)
    assert [(p.code, p.field) for p in problems][:1] == ([want] if case["code"] else [])
    if case["code"] is None:
        assert cli.main(["verify", folder]) == 0
    else:
        assert cli.main(["verify", folder]) == 1


@needs_native
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_corpus_cpp_through_the_native_module(case, tmp_path):
    folder = bc.materialise(case, str(tmp_path / "b"))
    got = _outcome(NATIVE.load_manifest, folder)
    assert got == (case["code"], case["field"])


def test_corpus_covers_every_code():
    covered = {c["code"] for c in CASES if c["code"]}
    assert covered == set(CODES)


def test_cli_reports_the_code(tmp_path, capsys):
    case = next(c for c in CASES if c["name"] == "elf-shstrndx-past-end")
    folder = bc.materialise(case, str(tmp_path / "b"))
    assert cli.main(["verify", folder]) == 1
    err = capsys.readouterr().err
    assert "[elf_header]" in err and "kernels[0].cubin" in err
    case = next(c for c in CASES if c["name"] == "manifest-fifo")
    folder = bc.materialise(case, str(tmp_path / "c"))
    assert cli.main(["inspect", folder]) == 1  # returns at once: the FIFO is never opened for data
    assert "[not_regular_file]" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Derived keys
# --------------------------------------------------------------------------------------------
def test_the_rule_books_key_is_the_catalogs_for_every_variant():
    from luminamoon.kernels import catalog

    variants = catalog.all_variants()
    assert variants
    for v in variants:
        assert mf.derive_key(v.kernel, dict(v.constexprs), v.num_warps) == v.key()
    assert {n for v in variants for n, _ in v.constexprs} <= set(mf.KEY_CONSTEXPRS)


def test_builder_refuses_a_variant_whose_key_is_not_derived(tmp_path):
    require("triton")
    from luminamoon.aot import builder
    from luminamoon.kernels import catalog

    class Renamed(catalog.Variant):
        def key(self) -> str:
            return "commit.f0.T1024.w4.renamed"

    v = catalog.all_variants()[0]
    bad = Renamed(v.kernel, v.constexprs, v.num_warps, v.num_stages, v.maxnreg)
    with pytest.raises(builder.BuildError, match=r"is not the one its kernel, constexprs"):
        builder.build_bundle(tmp_path / "b", archs=(90,), variants=[bad], progress=False)
    assert not (tmp_path / "b").exists()


# --------------------------------------------------------------------------------------------
# Mutation tests: only BundleError escapes, and both languages agree
# --------------------------------------------------------------------------------------------
hypothesis = import_or_skip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# Random each run (a failure prints the blob that reproduces it: @reproduce_failure), bounded
# to about a minute for the three tests together on a shared 2-core machine (measured there:
# 2,500 examples of each in 50-60 s); the sm_100 cubin's runs 1,000.
MUTATION_SETTINGS = settings(max_examples=2500, deadline=None, database=None, print_blob=True,
                             suppress_health_check=list(HealthCheck))

BASE_MANIFEST = open(os.path.join(bc.BASE, "manifest.json"), "rb").read()
C0 = json.loads(BASE_MANIFEST)["kernels"][0]["cubin"]
BASE_CUBIN = open(os.path.join(bc.BASE, C0), "rb").read()
C3 = json.loads(BASE_MANIFEST)["kernels"][3]["cubin"]  # sm_100: notes, .nv.compat, Mercury copy
BLACKWELL_CUBIN = open(os.path.join(bc.BASE, C3), "rb").read()
TOKENS = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"-", b"0", b"9" * 25, b"1e999", b"0.5",
          b"true", b"null", b"NaN", b"\\ud800", b"\\u0000", b"\xff", b"\xc0\x80", b"\xed\xa0\x80",
          b"\xef\xbb\xbf", b"[" * 40, b'"key": 1, "key": 2', b"\x00"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
    | st.floats(allow_nan=False) | st.text(max_size=12)
    | st.sampled_from(["", "*i32", "i8", "../x", "3.6.0", "a\u0000b", "\ud800", "pass2", "cuda"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children,
                                                                       max_size=4),
    max_leaves=12)


def _agree(folder):
    """The readers on ``folder``: each either accepts or raises BundleError, and the C++ loader
    (where built) with the same code and field as Python's."""
    outcomes = []
    for fn in (mf.read_manifest, mf.load_bundle, lambda d: mf.verify_bundle(d)):
        try:
            fn(folder)
            outcomes.append((None, None))
        except BundleError as exc:
            outcomes.append((exc.code, exc.field))
    for argv in (["inspect", folder], ["verify", folder]):
        assert cli.main(argv) in (0, 1)
    if NATIVE is not None:
        assert _outcome(NATIVE.load_manifest, folder) == outcomes[1]
    return outcomes[1]


def _bundle_with(tmp_path_factory, manifest: bytes = BASE_MANIFEST, cubin: bytes = BASE_CUBIN,
                 name: str = C0) -> str:
    folder = str(tmp_path_factory.mktemp("m"))
    os.rmdir(folder)
    shutil.copytree(bc.BASE, folder)
    with open(os.path.join(folder, "manifest.json"), "wb") as f:
        f.write(manifest)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(cubin)
    return folder


@MUTATION_SETTINGS
@given(edits=st.lists(st.tuples(st.integers(0, len(BASE_MANIFEST)), st.integers(0, 2),
                                st.sampled_from(TOKENS), st.integers(0, 255)),
                      min_size=1, max_size=6))
def test_mutated_manifest_text_raises_only_bundle_errors(tmp_path_factory, edits, capsys):
    """Python escaped with UnicodeDecodeError, RecursionError and ValueError on mutated text."""
    text = bytearray(BASE_MANIFEST)
    for pos, kind, token, byte in edits:
        pos = min(pos, len(text))
        if kind == 0:
            text[pos:pos] = token
        elif kind == 1 and pos < len(text):
            text[pos] = byte
        else:
            del text[pos:pos + byte % 32]
    _agree(_bundle_with(tmp_path_factory, manifest=bytes(text)))
    capsys.readouterr()


def _paths(doc, prefix=""):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, f"{prefix}/{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, f"{prefix}/{i}")


MANIFEST_PATHS = [p for p in _paths(json.loads(BASE_MANIFEST)) if p]


@MUTATION_SETTINGS
@given(edits=st.lists(st.tuples(st.sampled_from(MANIFEST_PATHS), json_values, st.booleans()),
                      min_size=1, max_size=3))
def test_mutated_manifest_values_raise_only_bundle_errors(tmp_path_factory, edits, capsys):
    """Values out of range or of another type (num_warps 3 or 64, num_ctas 17, shared memory
    2^31, scratch 2^41, an empty triton_version...), each refused the same in both languages."""
    doc = json.loads(BASE_MANIFEST)
    for path, value, remove in edits:
        try:
            parent, key = bc._pointer(doc, path)
            if remove:
                del parent[key]
            else:
                parent[key] = value
        except (KeyError, IndexError, TypeError, ValueError):
            continue  # the path went away with an earlier edit
    raw = json.dumps(doc, indent=1).encode("utf-8", "surrogatepass")
    _agree(_bundle_with(tmp_path_factory, manifest=raw))
    capsys.readouterr()


def _cubin_regions(data: bytes):
    from luminamoon.aot.cubin import parse_cubin

    info = parse_cubin(data)
    import struct
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shnum = struct.unpack_from("<H", data, 0x3C)[0]
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phnum = struct.unpack_from("<H", data, 0x38)[0]
    regions = [(0, 64), (shoff, shoff + 64 * shnum), (phoff, phoff + 56 * phnum)]
    for s in info.sections:
        if s.name in (".symtab", ".strtab", ".shstrtab", ".nv.callgraph", ".nv.compat",
                      ".nv.merc.symtab") or \
                s.name.startswith((".nv.info", ".rela", ".rel.", ".note", ".nv.merc.nv.info",
                                   ".nv.merc.rela")):
            regions.append((s.offset, s.offset + s.size))
    return [r for r in regions if r[1] > r[0]]


CUBIN_REGIONS = _cubin_regions(BASE_CUBIN)
BLACKWELL_REGIONS = _cubin_regions(BLACKWELL_CUBIN)


def _mutated_cubin(tmp_path_factory, base: bytes, regions, kernel: int, name: str, edits, cut):
    data = bytearray(base)
    for region, at, byte, width in edits:
        lo, hi = regions[region % len(regions)]
        pos = lo + at % (hi - lo)
        # 0x00.. and 0xff.. fill the field; anything else is a small value in its low byte
        value = bytes([byte]) * width if byte in (0, 255) else bytes([byte]) + bytes(width - 1)
        data[pos:pos + width] = value[:len(data) - pos]
    if cut is not None:
        del data[cut:]
    doc = json.loads(BASE_MANIFEST)
    doc["kernels"][kernel]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    return _bundle_with(tmp_path_factory, manifest=json.dumps(doc).encode(), cubin=bytes(data),
                        name=name)


@MUTATION_SETTINGS
@given(edits=st.lists(st.tuples(st.integers(0, len(CUBIN_REGIONS) - 1), st.integers(0, 1 << 20),
                                st.integers(0, 255), st.sampled_from([1, 2, 4, 8])),
                      min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, len(BASE_CUBIN))))
def test_mutated_cubin_structure_raises_only_bundle_errors(tmp_path_factory, edits, cut, capsys):
    """A cubin corrupted in its headers, section table, symbols or .nv.info, its sha256 updated
    to match: the ELF readers refuse it (or accept it) alike, and never crash."""
    _agree(_mutated_cubin(tmp_path_factory, BASE_CUBIN, CUBIN_REGIONS, 0, C0, edits, cut))
    capsys.readouterr()


@settings(MUTATION_SETTINGS, max_examples=1000)
@given(edits=st.lists(st.tuples(st.integers(0, len(BLACKWELL_REGIONS) - 1),
                                st.integers(0, 1 << 20), st.integers(0, 255),
                                st.sampled_from([1, 2, 4, 8])),
                      min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, len(BLACKWELL_CUBIN))))
def test_mutated_blackwell_cubin_raises_only_bundle_errors(tmp_path_factory, edits, cut, capsys):
    """The same for the sm_100 cubin: its notes, .nv.compat and the Mercury copy's symbol
    table, relocations and .nv.merc.nv.info too."""
    _agree(_mutated_cubin(tmp_path_factory, BLACKWELL_CUBIN, BLACKWELL_REGIONS, 3, C3, edits,
                          cut))
    capsys.readouterr()


H4 = json.loads(BASE_MANIFEST)["kernels"][4]["hsaco"]  # gfx942: an AMDGPU code object
HSACO = open(os.path.join(bc.BASE, H4), "rb").read()


def _hsaco_regions(data: bytes):
    """The header, the section table, and the sections a reader parses: symbol and string
    tables, the metadata note."""
    import struct

    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shnum, shstrndx = struct.unpack_from("<HH", data, 0x3C)
    shdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]
    regions = [(0, 64), (shoff, shoff + 64 * shnum)]
    regions += [(s[4], s[4] + s[5]) for s in shdrs if s[1] in (2, 3, 7, 11)]
    return [r for r in regions if r[1] > r[0]]


HSACO_REGIONS = _hsaco_regions(HSACO)


@settings(MUTATION_SETTINGS, max_examples=1000)
@given(edits=st.lists(st.tuples(st.integers(0, len(HSACO_REGIONS) - 1),
                                st.integers(0, 1 << 20), st.integers(0, 255),
                                st.sampled_from([1, 2, 4, 8])),
                      min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, len(HSACO))))
def test_mutated_hsaco_raises_only_bundle_errors(tmp_path_factory, edits, cut, capsys):
    """An AMD code object corrupted in its header, section table, symbols, strings or msgpack
    metadata note, its sha256 updated to match: the readers refuse it (or accept it) alike and
    raise nothing but BundleError (msgpack's own errors included)."""
    _agree(_mutated_cubin(tmp_path_factory, HSACO, HSACO_REGIONS, 4, H4, edits, cut))
    capsys.readouterr()


def test_the_readers_never_block_on_a_fifo_or_read_dev_zero(tmp_path):
    """A cubin that is a FIFO hung; one linked to /dev/zero read until memory ran out."""
    for case in ("cubin-fifo", "cubin-dev-zero", "manifest-fifo", "manifest-dev-zero"):
        folder = bc.materialise(next(c for c in CASES if c["name"] == case), str(tmp_path / case))
        assert _outcome(mf.load_bundle, folder)[0] == "not_regular_file"


def test_messages_name_file_field_expected_and_found(tmp_path):
    case = next(c for c in CASES if c["name"] == "num-warps-3")
    folder = bc.materialise(case, str(tmp_path / "b"))
    with pytest.raises(BundleError) as info:
        mf.load_bundle(folder)
    msg = str(info.value)
    assert msg.startswith(os.path.join(folder, "manifest.json"))
    assert re.search(r"kernels\[0\]\.num_warps: expected a power of two in 1\.\.32, found 3",
                     msg) and msg.endswith("[bad_value]")

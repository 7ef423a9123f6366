// tests/test_manifest.cpp: the bundle manifest (src/aot/manifest.cpp)
//
// AotManifest: parsing, validation, cubin verification (on first use, and all at once) and
// variant lookup, on bundles written by the test itself; every corrupt bundle is refused with a
// message naming file, field, expected and found, and none crashes the process.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "aot/manifest.h"
#include "fakes/expect_error.h"
#include "fakes/fake_bundle.h"
#include "luminav/error.h"

using luminav::AotManifest;
using luminav::BundleRule;
using luminav::Error;
using luminav::Status;
using namespace luminav_test;

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(luminav::sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(luminav::sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(luminav::sha256_hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    entry_ = add_variant(dir_, kPass2Key, 90);
    write_manifest(dir_, manifest_with({entry_}));
  }
  // Rewrites the manifest with its single entry changed by `edit`, and expects load to refuse it
  // for `rule`, naming `field`.
  void expect_manifest_refused(const std::function<void(json&)>& edit, BundleRule rule, const std::string& field,
                               const std::vector<std::string>& substrings = {}) {
    json m = manifest_with({entry_});
    edit(m);
    write_manifest(dir_, m);
    SCOPED_TRACE(m.dump().substr(0, 120));
    expect_refusal([&] { AotManifest::load(dir_.path()); }, rule, field, substrings);
  }
  std::string manifest_path() const { return dir_.file("manifest.json"); }
  std::string cubin_path() const { return dir_.file(entry_["cubin"].get<std::string>()); }

  // A cubin whose content is bad: the manifest still loads (the cubin is read on first use),
  // and each way of reading it refuses it with Error(kBundleError) holding every substring:
  // KernelMetadata::image, AotManifest::verify_cubins and load with CubinCheck::kNow.
  void expect_cubin_refused(BundleRule rule, const std::string& field, const std::vector<std::string>& substrings) {
    const AotManifest m = AotManifest::load(dir_.path());
    ASSERT_EQ(m.kernels().size(), 1u);
    EXPECT_FALSE(m.kernels()[0].image_verified());
    expect_refusal([&] { m.kernels()[0].image(); }, rule, field, substrings);
    EXPECT_FALSE(m.kernels()[0].image_verified());
    expect_refusal([&] { m.verify_cubins(); }, rule, field, substrings);
    expect_refusal([&] { AotManifest::load(dir_.path(), luminav::CubinCheck::kNow); }, rule, field, substrings);
  }

  TempDir dir_;
  json entry_;
};

TEST_F(ManifestTest, LoadsAValidBundle) {
  const AotManifest m = AotManifest::load(dir_.path());
  EXPECT_EQ(m.format_version(), 2);
  EXPECT_EQ(m.table_cols(), 21);
  EXPECT_EQ(m.created_by(), "luminamoon 0.1.0");
  EXPECT_EQ(m.triton_version(), "3.6.0");
  ASSERT_EQ(m.kernels().size(), 1u);
  const luminav::KernelMetadata& k = m.kernels()[0];
  EXPECT_EQ(k.key, kPass2Key);
  EXPECT_EQ(k.kernel, "pass2");
  EXPECT_EQ(k.entry, "_lumina_tdclm_pass2_kernel");
  EXPECT_EQ(k.arch, 90);
  EXPECT_EQ(k.arch_major(), 9);
  EXPECT_EQ(k.arch_minor(), 0);
  EXPECT_EQ(k.num_warps, 8);
  EXPECT_EQ(k.block_threads(), 256);
  EXPECT_EQ(k.num_params, 15);
  EXPECT_EQ(k.num_trailing_scratch_ptrs, 2);
  EXPECT_EQ(k.arg_names, pass2_arg_names());
  EXPECT_EQ(k.signature, pass2_signature());
  ASSERT_EQ(k.arg_types.size(), 13u);
  EXPECT_TRUE(k.arg_types[0].pointer);
  EXPECT_EQ(k.arg_types[0].element, "i64");
  EXPECT_EQ(k.arg_types[0].size, 8u);
  EXPECT_FALSE(k.arg_types[5].pointer);  // seed i64
  EXPECT_EQ(k.arg_types[5].size, 8u);
  EXPECT_EQ(k.arg_types[6].size, 4u);  // sign fp32
  EXPECT_EQ(k.constexprs.at("BLOCK"), 2048);
  EXPECT_EQ(k.constexprs.at("BOUND_MODE"), 2);
  // Loading stats the cubin; its bytes are read on first use: the file's bytes, matching the
  // recorded hash, and the same buffer on every later call.
  std::ifstream f(cubin_path(), std::ios::binary);
  std::vector<unsigned char> on_disk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(k.cubin_bytes, on_disk.size());
  EXPECT_FALSE(k.image_verified());
  EXPECT_EQ(k.image(), on_disk);
  EXPECT_TRUE(k.image_verified());
  EXPECT_EQ(luminav::sha256_hex(k.image().data(), k.image().size()), k.sha256);
  EXPECT_EQ(&k.image(), &k.image());
  EXPECT_EQ(m.keys(), std::vector<std::string>{kPass2Key});
}

TEST_F(ManifestTest, ConstexprBooleansAreRefused) {
  // The key is derived from the integers; true is not 1 (Python's str(True) is "True").
  expect_manifest_refused([](json& m) { m["kernels"][0]["constexprs"]["SR"] = true; }, BundleRule::kBadType,
                          "kernels[0].constexprs.SR", {"expected an integer", "found boolean true"});
}

TEST(ManifestKey, IsDerivedFromKernelConstexprsAndWarps) {
  EXPECT_EQ(luminav::derive_variant_key("pass2", {{"P_DTYPE", 1}, {"G_DTYPE", 1}, {"S_DTYPE", 0}, {"SR", 1},
                                                  {"BOUND_MODE", 2}, {"USE_CLIP", 1}, {"CHECK_FLAG", 1},
                                                  {"BLOCK", 1024}},
                                        4),
            "pass2.p1g1s0.sr1.b2.c1.f1.B1024.w4");
  EXPECT_EQ(luminav::derive_variant_key("reduce", {{"RBLOCK", 16384}, {"BLOCK", 1024}}, 16), "reduce.B1024.R16384.w16");
  EXPECT_EQ(luminav::derive_variant_key("commit", {{"TBLOCK", 1024}, {"CHECK_FLAG", 0}}, 4), "commit.f0.T1024.w4");
  EXPECT_EQ(luminav::derive_variant_key("pass1", {{"S_DTYPE", 1}, {"G_DTYPE", 0}, {"NEED_SUM", 1}}, 8),
            "pass1.g0s1.n1.w8");
}

TEST(ManifestFind, PicksTheSameMajorAndTheHighestMinorNotAboveTheDevice) {
  TempDir dir;
  write_manifest(dir, manifest_with({add_variant(dir, kPass2Key, 80), add_variant(dir, kPass2Key, 86),
                                     add_variant(dir, kPass2Key, 90), add_variant(dir, "commit.f1.T1024.w4", 90)}));
  const AotManifest m = AotManifest::load(dir.path());
  struct Case {
    int major, minor, want;  // want 0: none
  };
  for (const Case c : {Case{8, 0, 80}, Case{8, 6, 86}, Case{8, 9, 86}, Case{9, 0, 90}, Case{9, 5, 90},
                       Case{7, 5, 0}, Case{10, 0, 0}, Case{12, 0, 0}}) {
    const luminav::KernelMetadata* k = m.find(kPass2Key, c.major, c.minor);
    if (c.want == 0) {
      EXPECT_EQ(k, nullptr) << c.major << "." << c.minor;
    } else {
      ASSERT_NE(k, nullptr) << c.major << "." << c.minor;
      EXPECT_EQ(k->arch, c.want) << c.major << "." << c.minor;
      EXPECT_EQ(&m.require(kPass2Key, c.major, c.minor), k);
    }
  }
  EXPECT_EQ(m.archs_for(kPass2Key), (std::vector<int>{80, 86, 90}));
  EXPECT_EQ(m.find("commit.f1.T1024.w4", 8, 6), nullptr);
  EXPECT_EQ(m.keys().size(), 2u);
  // A newer major is refused too: cubins do not run forward across majors.
  expect_error([&] { m.require(kPass2Key, 10, 0); }, Status::kNotFound,
               {dir.file("manifest.json"), kPass2Key, "compute capability 10.0", "sm_80, sm_86, sm_90",
                "luminamoon aot build --arch 100"});
  expect_error([&] { m.require("pass2.nope", 9, 0); }, Status::kNotFound,
               {"\"pass2.nope\"", "no variant with this key", "luminamoon aot build --arch 90"});
}

// ---------------------------------------------------------------------------------------------
// Refusals of the manifest as a whole.

TEST_F(ManifestTest, RefusesGarbageJson) {
  write_text(manifest_path(), "{\"format\": \"luminamoon-aot-bundle\", \"kernels\": [ {");
  expect_refusal([&] { AotManifest::load(dir_.path()); }, BundleRule::kBadJson, "(file)",
                 {manifest_path(), "not valid JSON"});
  write_text(manifest_path(), "\x89PNG\r\n\x1a\n binary garbage \xff\xfe");
  expect_refusal([&] { AotManifest::load(dir_.path()); }, BundleRule::kBadJson, "(file)",
                 {manifest_path(), "not valid JSON"});
}

TEST_F(ManifestTest, RefusesAnEmptyOrMissingManifest) {
  write_text(manifest_path(), "");
  expect_refusal([&] { AotManifest::load(dir_.path()); }, BundleRule::kBadJson, "(file)", {manifest_path()});
  std::filesystem::remove(manifest_path());
  expect_refusal([&] { AotManifest::load(dir_.path()); }, BundleRule::kMissingFile, "(file)",
                 {manifest_path(), "no such file", "luminamoon aot build"});
  expect_refusal([&] { AotManifest::load(dir_.file("no-such-bundle")); }, BundleRule::kMissingFile, "(file)",
                 {"no-such-bundle/manifest.json"});
}

TEST_F(ManifestTest, RefusesANonObjectTopLevel) {
  write_text(manifest_path(), "[1, 2, 3]");
  expect_refusal([&] { AotManifest::load(dir_.path()); }, BundleRule::kBadType, "(top level)",
                 {manifest_path(), "expected a JSON object", "found an array of 3"});
}

TEST_F(ManifestTest, RefusesAMissingOrUnknownFormat) {
  expect_manifest_refused([](json& m) { m.erase("format"); }, BundleRule::kFormat, "format",
                          {manifest_path(), "field \"format\"", "the field is missing"});
  expect_manifest_refused([](json& m) { m["format"] = "other-bundle"; }, BundleRule::kFormat, "format",
                          {"\"luminamoon-aot-bundle\"", "found string \"other-bundle\""});
  expect_manifest_refused([](json& m) { m["format"] = 7; }, BundleRule::kFormat, "format", {"found integer 7"});
}

TEST_F(ManifestTest, RefusesANewerOrMissingFormatVersion) {
  expect_manifest_refused([](json& m) { m["format_version"] = 4; }, BundleRule::kFormatVersion, "format_version",
                          {manifest_path(), "expected an integer in 1..3", "found integer 4", "update luminav"});
  expect_manifest_refused([](json& m) { m.erase("format_version"); }, BundleRule::kFormatVersion, "format_version",
                          {"the field is missing"});
  expect_manifest_refused([](json& m) { m["format_version"] = "1"; }, BundleRule::kBadType, "format_version",
                          {"expected an integer", "found string \"1\""});
  expect_manifest_refused([](json& m) { m["format_version"] = 0; }, BundleRule::kFormatVersion, "format_version",
                          {"found integer 0"});
}

TEST_F(ManifestTest, TableColsIsRequiredFromVersion2AndImpliedByVersion1) {
  expect_manifest_refused([](json& m) { m.erase("table_cols"); }, BundleRule::kMissingField, "table_cols",
                          {"the field is missing"});
  expect_manifest_refused([](json& m) { m["table_cols"] = "18"; }, BundleRule::kBadType, "table_cols",
                          {"found string \"18\""});
  expect_manifest_refused([](json& m) { m["table_cols"] = 0; }, BundleRule::kBadValue, "table_cols",
                          {"expected an integer in 1..4096", "found 0"});
  json v1 = json::parse(read_text(manifest_path()));
  v1["format_version"] = 1;
  v1.erase("table_cols");
  write_text(manifest_path(), v1.dump());
  const AotManifest m = AotManifest::load(dir_.path());
  EXPECT_EQ(m.format_version(), 1);
  EXPECT_EQ(m.table_cols(), luminav::kAotBundleV1TableCols);
}

TEST_F(ManifestTest, RefusesAnEmptyOrMissingTritonVersion) {
  expect_manifest_refused([](json& m) { m["triton_version"] = ""; }, BundleRule::kBadValue, "triton_version",
                          {"a version such as \"3.6.0\""});
  expect_manifest_refused([](json& m) { m["kernels"][0]["triton_version"] = ""; }, BundleRule::kBadValue,
                          "kernels[0].triton_version");
  expect_manifest_refused([](json& m) { m["kernels"][0]["triton_version"] = "3.x"; }, BundleRule::kBadValue,
                          "kernels[0].triton_version");
  expect_manifest_refused([](json& m) { m.erase("created_by"); }, BundleRule::kMissingField, "created_by");
}

TEST_F(ManifestTest, RefusesMissingOrEmptyKernels) {
  expect_manifest_refused([](json& m) { m.erase("kernels"); }, BundleRule::kMissingField, "kernels",
                          {"the field is missing"});
  expect_manifest_refused([](json& m) { m["kernels"] = json::object(); }, BundleRule::kBadType, "kernels",
                          {"found an object"});
  expect_manifest_refused([](json& m) { m["kernels"] = json::array(); }, BundleRule::kBadValue, "kernels",
                          {"found an empty array"});
  expect_manifest_refused([](json& m) { m["kernels"][0] = 7; }, BundleRule::kBadType, "kernels[0]",
                          {"kernels[0]", "expected an object", "found integer 7"});
}

// ---------------------------------------------------------------------------------------------
// Refusals of one kernel entry.

TEST_F(ManifestTest, RefusesEveryMissingKernelField) {
  for (const char* field : {"key", "kernel", "name", "entry", "cubin", "sha256", "target", "triton_version",
                            "num_warps", "num_ctas", "num_stages", "shared_mem", "arg_names", "signature",
                            "constexprs", "num_params", "num_trailing_scratch_ptrs", "global_scratch_size",
                            "global_scratch_align", "profile_scratch_size", "profile_scratch_align"}) {
    SCOPED_TRACE(field);
    expect_manifest_refused([&](json& m) { m["kernels"][0].erase(field); }, BundleRule::kMissingField,
                            std::string("kernels[0].") + field,
                            {manifest_path(), "kernels[0]", std::string("field \"") + field + "\"",
                             "the field is missing"});
  }
  for (const char* field : {"backend", "arch", "warp_size"}) {
    SCOPED_TRACE(field);
    expect_manifest_refused([&](json& m) { m["kernels"][0]["target"].erase(field); }, BundleRule::kMissingField,
                            std::string("kernels[0].target.") + field, {"the field is missing"});
  }
}

TEST_F(ManifestTest, RefusesWrongFieldTypes) {
  const std::string where = std::string("kernels[0] (key \"") + kPass2Key + "\")";
  expect_manifest_refused([](json& m) { m["kernels"][0]["num_warps"] = "8"; }, BundleRule::kBadType,
                          "kernels[0].num_warps",
                          {manifest_path(), where, "field \"num_warps\"", "expected an integer", "found string \"8\""});
  expect_manifest_refused([](json& m) { m["kernels"][0]["num_warps"] = true; }, BundleRule::kBadType,
                          "kernels[0].num_warps", {"found boolean true"});
  expect_manifest_refused([](json& m) { m["kernels"][0]["key"] = 42; }, BundleRule::kBadType, "kernels[0].key",
                          {"expected a string", "found integer 42"});
  expect_manifest_refused([](json& m) { m["kernels"][0]["signature"] = "*i64,*i32"; }, BundleRule::kBadType,
                          "kernels[0].signature", {"expected an array of strings", "found string"});
  expect_manifest_refused([](json& m) { m["kernels"][0]["arg_names"][4] = 5; }, BundleRule::kBadType,
                          "kernels[0].arg_names[4]", {"expected a string", "found integer 5"});
  expect_manifest_refused([](json& m) { m["kernels"][0]["target"] = "sm_90"; }, BundleRule::kBadType,
                          "kernels[0].target", {"expected an object", "found string \"sm_90\""});
  expect_manifest_refused([](json& m) { m["kernels"][0]["target"]["arch"] = "90"; }, BundleRule::kBadType,
                          "kernels[0].target.arch", {"field \"arch\"", "found string \"90\""});
  expect_manifest_refused([](json& m) { m["kernels"][0]["constexprs"] = json::array(); }, BundleRule::kBadType,
                          "kernels[0].constexprs", {"expected an object of integers", "found an array of 0"});
  expect_manifest_refused([](json& m) { m["kernels"][0]["shared_mem"] = nullptr; }, BundleRule::kBadType,
                          "kernels[0].shared_mem", {"found null"});
}

TEST_F(ManifestTest, RefusesValuesOutOfRange) {
  struct Case {
    std::function<void(json&)> edit;
    const char* field;
    std::vector<std::string> text;
  };
  const std::vector<Case> cases = {
      {[](json& k) { k["shared_mem"] = -1; }, "shared_mem", {"expected an integer in 0..2147483647", "found -1"}},
      {[](json& k) { k["shared_mem"] = std::int64_t{1} << 31; }, "shared_mem", {"found 2147483648"}},
      {[](json& k) { k["global_scratch_size"] = -8; }, "global_scratch_size", {"found -8"}},
      {[](json& k) { k["global_scratch_size"] = std::int64_t{1} << 41; }, "global_scratch_size", {"in 0..1099511627776"}},
      {[](json& k) { k["profile_scratch_size"] = -1; }, "profile_scratch_size", {"found -1"}},
      {[](json& k) { k["global_scratch_align"] = 3; }, "global_scratch_align", {"expected a power of two", "found 3"}},
      {[](json& k) { k["num_warps"] = 6; }, "num_warps", {"expected a power of two in 1..32", "found 6"}},
      {[](json& k) { k["num_warps"] = 3; }, "num_warps", {"found 3"}},
      {[](json& k) { k["num_warps"] = 64; }, "num_warps", {"found 64"}},
      {[](json& k) { k["num_ctas"] = 17; }, "num_ctas", {"expected an integer in 1..16", "found 17"}},
      {[](json& k) { k["num_stages"] = 65; }, "num_stages", {"found 65"}},
      {[](json& k) { k["target"]["warp_size"] = 64; }, "target.warp_size", {"expected 32", "found 64"}},
      {[](json& k) { k["target"]["arch"] = 9; }, "target.arch", {"found 9"}},
      {[](json& k) { k["target"]["backend"] = "rocm"; }, "target.backend", {"expected \"cuda\" or \"hip\"", "found \"rocm\""}},
      {[](json& k) { k["kernel"] = "pass3"; }, "kernel", {"one of pass1, reduce, pass2, single_pass, commit", "found \"pass3\""}},
      {[](json& k) { k["name"] = ""; }, "name", {"a non-empty string"}},
      {[](json& k) { k["entry"] = "has space"; }, "entry", {"a symbol name"}},
      {[](json& k) { k["sha256"] = std::string(64, 'A'); }, "sha256", {"64 lowercase hex digits"}},
      {[](json& k) { k["cubin"] = "../elsewhere.cubin"; }, "cubin", {"no path separators", "found \"../elsewhere.cubin\""}},
      {[](json& k) { k["cubin"] = std::string("a\0b.cubin", 9); }, "cubin", {"found \"a\\x00b.cubin\""}},
      {[](json& k) { k["cubin"] = std::string(300, 'c'); }, "cubin", {"at most 255 bytes"}},
      {[](json& k) { k["num_trailing_scratch_ptrs"] = 3; k["num_params"] = 16; }, "num_trailing_scratch_ptrs",
       {"expected an integer in 0..2", "found 3"}},
      {[](json& k) { k["constexprs"]["EXTRA"] = 1; }, "constexprs.EXTRA", {"a constexpr the variant key encodes"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    expect_manifest_refused([&](json& m) { c.edit(m["kernels"][0]); }, BundleRule::kBadValue,
                            std::string("kernels[0].") + c.field, c.text);
  }
}

TEST_F(ManifestTest, RefusesAnArgumentCountOffByOne) {
  expect_manifest_refused([](json& m) { m["kernels"][0]["num_params"] = 16; }, BundleRule::kNumParams,
                          "kernels[0].num_params",
                          {manifest_path(), "expected 15 (len(signature) 13 + num_trailing_scratch_ptrs 2)", "found 16"});
  expect_manifest_refused([](json& m) { m["kernels"][0]["num_params"] = 14; }, BundleRule::kNumParams,
                          "kernels[0].num_params", {"found 14"});
  // Dropping one signature entry (and its name) leaves num_params one too many.
  expect_manifest_refused(
      [](json& m) {
        m["kernels"][0]["signature"].erase(12);
        m["kernels"][0]["arg_names"].erase(12);
      },
      BundleRule::kNumParams, "kernels[0].num_params", {"expected 14 (len(signature) 12", "found 15"});
  expect_manifest_refused([](json& m) { m["kernels"][0]["arg_names"].erase(0); }, BundleRule::kNumParams,
                          "kernels[0].arg_names", {"one name per signature entry (13)", "found 12 names"});
}

TEST_F(ManifestTest, RefusesUnknownTypeWords) {
  for (const char* word : {"*fp33", "constexpr", "fp8e5", "", "i8", "*fp8e4nv", "*void", "**i32"}) {
    SCOPED_TRACE(word);
    expect_manifest_refused([&](json& m) { m["kernels"][0]["signature"][2] = word; }, BundleRule::kBadValue,
                            "kernels[0].signature[2]", {"a Triton type word"});
  }
}

TEST_F(ManifestTest, RefusesScratchWithoutItsTrailingPointer) {
  expect_manifest_refused(
      [](json& m) {
        m["kernels"][0]["num_trailing_scratch_ptrs"] = 0;
        m["kernels"][0]["num_params"] = 13;
        m["kernels"][0]["global_scratch_size"] = 128;
      },
      BundleRule::kScratch, "kernels[0].global_scratch_size", {"no global scratch parameter", "found 128"});
  expect_manifest_refused(
      [](json& m) {
        m["kernels"][0]["num_trailing_scratch_ptrs"] = 1;
        m["kernels"][0]["num_params"] = 14;
        m["kernels"][0]["profile_scratch_size"] = 64;
      },
      BundleRule::kScratch, "kernels[0].profile_scratch_size", {"no profile scratch parameter", "found 64"});
}

TEST_F(ManifestTest, RefusesATrailingCountTheTritonVersionDoesNotAppend) {
  // The manifest is consistent (num_params agrees), but Triton 3.6 appends 2 pointers, not 1.
  expect_manifest_refused(
      [](json& m) {
        m["kernels"][0]["num_trailing_scratch_ptrs"] = 1;
        m["kernels"][0]["num_params"] = 14;
      },
      BundleRule::kScratch, "kernels[0].num_trailing_scratch_ptrs", {"expected 2 (what Triton 3.6.0 appends)", "found 1"});
  expect_manifest_refused([](json& m) { m["kernels"][0]["triton_version"] = "3.2.0"; }, BundleRule::kScratch,
                          "kernels[0].num_trailing_scratch_ptrs", {"expected 0"});
  // Outside 3.x the table does not know the count: not checked.
  json m = manifest_with({entry_});
  m["kernels"][0]["triton_version"] = "4.0.0";
  write_manifest(dir_, m);
  EXPECT_NO_THROW(AotManifest::load(dir_.path()));
}

TEST_F(ManifestTest, RefusesAKeyThatIsNotTheDerivedOne) {
  expect_manifest_refused([](json& m) { m["kernels"][0]["key"] = "pass2.p1g1s0.sr0.b2.c1.f1.B2048.w8"; },
                          BundleRule::kKeyMismatch, "kernels[0].key",
                          {"\"pass2.p1g1s0.sr1.b2.c1.f1.B2048.w8\" (derived from kernel, constexprs and num_warps)"});
  expect_manifest_refused([](json& m) { m["kernels"][0]["constexprs"]["SR"] = 0; }, BundleRule::kKeyMismatch,
                          "kernels[0].key");
  expect_manifest_refused([](json& m) { m["kernels"][0]["num_warps"] = 4; }, BundleRule::kKeyMismatch,
                          "kernels[0].key");
  // The key and everything it derives from agree, but the cubin is another variant's file.
  expect_manifest_refused([](json& m) { m["kernels"][0]["cubin"] = "pass2.other.sm90.cubin"; },
                          BundleRule::kKeyMismatch, "kernels[0].cubin",
                          {"expected \"" + std::string(kPass2Key) + ".sm90.cubin\""});
}

TEST(ManifestKeys, TwoVariantsWithTheirKeysSwappedAreRefused) {
  TempDir dir;
  json a = add_variant(dir, "commit.f0.T1024.w4", 90);
  json b = add_variant(dir, "commit.f1.T1024.w4", 90);
  std::swap(a["key"], b["key"]);
  write_manifest(dir, manifest_with({a, b}));
  expect_refusal([&] { AotManifest::load(dir.path(), luminav::CubinCheck::kNow); }, BundleRule::kKeyMismatch,
                 "kernels[0].key", {"\"commit.f0.T1024.w4\" (derived from"});
}

TEST_F(ManifestTest, RefusesADuplicateVariant) {
  json m = manifest_with({entry_, entry_});
  write_manifest(dir_, m);
  expect_refusal([&] { AotManifest::load(dir_.path()); }, BundleRule::kDuplicate, "kernels[1]",
                 {"one entry per (key, arch)", "for arch 90", "first at kernels[0]"});
}

// ---------------------------------------------------------------------------------------------
// Refusals of the cubin file.

TEST_F(ManifestTest, RefusesAHashMismatch) {
  const std::string recorded = entry_["sha256"];
  const std::vector<unsigned char> original = read_bytes(cubin_path());
  write_bytes(cubin_path(), make_fake_cubin("tampered"));
  const auto now = make_fake_cubin("tampered");
  expect_cubin_refused(BundleRule::kSha256, "kernels[0].sha256",
                       {manifest_path(), "kernels[0] (key \"" + std::string(kPass2Key) + "\")", "field \"sha256\"",
                        "expected " + recorded, "found " + luminav::sha256_hex(now.data(), now.size()), cubin_path(),
                        "rebuild the bundle"});
  write_bytes(cubin_path(), original);
  json m = manifest_with({entry_});
  m["kernels"][0]["sha256"] = std::string(64, 'f');
  write_manifest(dir_, m);
  expect_cubin_refused(BundleRule::kSha256, "kernels[0].sha256", {"expected " + std::string(64, 'f')});
}

TEST_F(ManifestTest, ARefusedCubinIsReadAgainAndAVerifiedOneIsNot) {
  const std::vector<unsigned char> good = read_bytes(cubin_path());
  write_bytes(cubin_path(), make_fake_cubin("tampered"));
  const AotManifest m = AotManifest::load(dir_.path());
  const luminav::KernelMetadata& k = m.kernels()[0];
  expect_refusal([&] { k.image(); }, BundleRule::kSha256, "kernels[0].sha256");
  // The refusal is not remembered: the repaired file is read and accepted.
  write_bytes(cubin_path(), good);
  EXPECT_EQ(k.image(), good);
  // Once verified, the bytes are held: a later change of the file does not reach the driver.
  write_bytes(cubin_path(), make_fake_cubin("tampered after the check"));
  EXPECT_EQ(k.image(), good);
  m.verify_cubins();  // nothing left to read
  // A copy of the manifest shares the verified bytes.
  const AotManifest copy = m;
  EXPECT_TRUE(copy.kernels()[0].image_verified());
  EXPECT_EQ(&copy.kernels()[0].image(), &k.image());
}

TEST_F(ManifestTest, ConcurrentFirstReadsVerifyOnceAndAgree) {
  const AotManifest m = AotManifest::load(dir_.path());
  std::vector<const std::vector<unsigned char>*> got(8, nullptr);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = &m.kernels()[0].image(); });
  }
  for (auto& t : threads) t.join();
  for (const auto* g : got) EXPECT_EQ(g, got[0]);
  EXPECT_EQ(luminav::sha256_hex(got[0]->data(), got[0]->size()), entry_["sha256"].get<std::string>());
}

TEST_F(ManifestTest, LoadReadsNoCubinOnlyTheManifest) {
  // Every cubin but one is replaced by a corrupt file: the manifest loads, and the good one
  // reads; the others are refused when read.
  TempDir dir;
  std::vector<json> entries;
  for (int arch : {80, 86, 89, 90}) entries.push_back(add_variant(dir, kPass2Key, arch));
  write_manifest(dir, manifest_with(entries));
  for (std::size_t i = 1; i < entries.size(); ++i) {
    write_bytes(dir.file(entries[i]["cubin"].get<std::string>()), make_fake_cubin("corrupt"));
  }
  const AotManifest m = AotManifest::load(dir.path());
  ASSERT_EQ(m.kernels().size(), 4u);
  for (const auto& k : m.kernels()) EXPECT_FALSE(k.image_verified()) << k.arch;
  EXPECT_NO_THROW(m.kernels()[0].image());
  expect_refusal([&] { m.verify_cubins(); }, BundleRule::kSha256, "kernels[1].sha256",
                 {dir.file(entries[1]["cubin"].get<std::string>())});
  expect_refusal([&] { AotManifest::load(dir.path(), luminav::CubinCheck::kNow); }, BundleRule::kSha256,
                 "kernels[1].sha256");
}

TEST_F(ManifestTest, RefusesAMissingCubin) {
  std::filesystem::remove(cubin_path());
  expect_refusal([&] { AotManifest::load(dir_.path()); }, BundleRule::kMissingFile, "kernels[0].cubin",
                 {cubin_path(), "no such file"});
}

TEST_F(ManifestTest, RefusesACubinRemovedAfterLoadWhenItIsRead) {
  const AotManifest m = AotManifest::load(dir_.path());
  std::filesystem::remove(cubin_path());
  expect_refusal([&] { m.kernels()[0].image(); }, BundleRule::kMissingFile, "kernels[0].cubin",
                 {cubin_path(), "no such file"});
}

TEST_F(ManifestTest, RefusesACubinThatIsADirectory) {
  std::filesystem::remove(cubin_path());
  std::filesystem::create_directory(cubin_path());
  expect_refusal([&] { AotManifest::load(dir_.path()); }, BundleRule::kNotRegularFile, "kernels[0].cubin",
                 {cubin_path(), "expected a regular file", "found a directory"});
}

TEST_F(ManifestTest, RefusesAnEmptyCubin) {
  write_bytes(cubin_path(), {});
  expect_cubin_refused(BundleRule::kTruncated, "kernels[0].cubin", {manifest_path(), cubin_path(), "is empty"});
}

TEST_F(ManifestTest, RefusesATruncatedCubin) {
  const std::vector<unsigned char> bytes = read_bytes(cubin_path());
  const std::size_t full = bytes.size();
  for (const std::size_t keep : {full - 1, full - 64, full - 130, std::size_t{70}, std::size_t{40}}) {
    SCOPED_TRACE(keep);
    write_bytes(cubin_path(), std::vector<unsigned char>(bytes.begin(), bytes.begin() + static_cast<long>(keep)));
    expect_cubin_refused(BundleRule::kTruncated, "kernels[0].cubin",
                         {cubin_path(), "(" + std::to_string(keep) + " bytes)", "truncated"});
  }
}

TEST_F(ManifestTest, RefusesACubinThatIsNotElf) {
  std::vector<unsigned char> text(200, 'x');
  write_bytes(cubin_path(), text);
  expect_cubin_refused(BundleRule::kElfHeader, "kernels[0].cubin", {cubin_path(), "does not start with the ELF magic"});
}

TEST_F(ManifestTest, RefusesAnElfFileForAnotherMachine) {
  std::vector<unsigned char> bytes = make_fake_cubin("host code");
  bytes[0x12] = 62;  // EM_X86_64
  bytes[0x13] = 0;
  write_bytes(cubin_path(), bytes);
  expect_cubin_refused(BundleRule::kElfHeader, "kernels[0].cubin", {cubin_path(), "ELF machine is 62, not CUDA (190)"});
}

// The cubin checks after the hash, with the hash updated to match (what a loader that trusts the
// hash alone would send to the driver).
class CubinContentTest : public ManifestTest {
 protected:
  // Writes `bytes` as the cubin and records its hash in the manifest.
  void rehashed(const std::vector<unsigned char>& bytes) {
    write_bytes(cubin_path(), bytes);
    entry_["sha256"] = luminav::sha256_hex(bytes.data(), bytes.size());
    write_manifest(dir_, manifest_with({entry_}));
  }
  FakeCubin pass2_cubin() const {
    FakeCubin c;
    c.payload = "code";
    c.entry = "_lumina_tdclm_pass2_kernel";
    c.arch = 90;
    c.param_sizes = {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8, 8};
    c.threads = 256;
    return c;
  }
};

TEST_F(CubinContentTest, TheFakeIsAccepted) {
  rehashed(make_fake_cubin(pass2_cubin()));
  EXPECT_NO_THROW(AotManifest::load(dir_.path(), luminav::CubinCheck::kNow));
}

TEST_F(CubinContentTest, RefusesAMissingEntrySymbol) {
  FakeCubin c = pass2_cubin();
  c.entry = "_some_other_kernel";
  rehashed(make_fake_cubin(c));
  expect_cubin_refused(BundleRule::kNoEntrySymbol, "kernels[0].entry",
                       {"one global function symbol \"_lumina_tdclm_pass2_kernel\"", "found 0"});
  rehashed(make_fake_cubin("no symbol table at all"));
  expect_cubin_refused(BundleRule::kNoEntrySymbol, "kernels[0].entry", {});
}

TEST_F(CubinContentTest, RefusesACubinOfAnotherArch) {
  FakeCubin c = pass2_cubin();
  c.arch = 80;
  rehashed(make_fake_cubin(c));
  expect_cubin_refused(BundleRule::kArch, "kernels[0].target.arch", {"expected sm_80", "found sm_90"});
}

TEST_F(CubinContentTest, RefusesAParameterListOtherThanTheSignatures) {
  FakeCubin c = pass2_cubin();
  c.param_sizes.pop_back();  // one trailing pointer fewer than the manifest's 2
  rehashed(make_fake_cubin(c));
  expect_cubin_refused(BundleRule::kParamMismatch, "kernels[0].num_params", {"expected 14", "found 15"});
  c = pass2_cubin();
  c.param_sizes[5] = 4;  // seed as 4 bytes where the signature says i64
  rehashed(make_fake_cubin(c));
  expect_cubin_refused(BundleRule::kParamMismatch, "kernels[0].signature", {"an ABI mismatch"});
}

TEST_F(CubinContentTest, RefusesABlockSizeOtherThanNumWarps) {
  FakeCubin c = pass2_cubin();
  c.threads = 128;  // the kernel requires 4 warps; the manifest launches 8
  rehashed(make_fake_cubin(c));
  expect_cubin_refused(BundleRule::kLaunchShape, "kernels[0].num_warps", {"expected 128 threads", "found 256"});
}

// Random byte flips, cuts and insertions in the manifest text: each either loads or is refused
// as a bundle error; nothing else escapes and nothing crashes (run under ASan/UBSan too).
TEST_F(ManifestTest, CorruptedManifestTextNeverCrashes) {
  const std::string good = manifest_with({entry_, add_variant(dir_, kPass2Key, 80)}).dump(1);
  std::mt19937 rng(12345);
  int refused = 0, loaded = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string text = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = rng() % text.size();
      switch (rng() % 3) {
        case 0: text[pos] = static_cast<char>(rng() % 256); break;
        case 1: text.erase(pos, 1 + rng() % 16); break;
        default: text.insert(pos, 1, "{}[]\",:-0e9"[rng() % 11]); break;
      }
      if (text.empty()) text = "x";
    }
    write_text(manifest_path(), text);
    try {
      const AotManifest m = AotManifest::load(dir_.path());
      EXPECT_FALSE(m.kernels().empty());
      ++loaded;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kBundleError) << e.what();
      EXPECT_NE(std::string(e.what()).find(manifest_path()), std::string::npos) << e.what();
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-luminav exception for a corrupt manifest: " << e.what();
    }
  }
  EXPECT_GT(refused, 300);  // almost every random edit breaks the manifest
  EXPECT_EQ(refused + loaded, 400);
}

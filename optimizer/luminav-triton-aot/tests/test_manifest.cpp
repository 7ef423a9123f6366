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
  // Rewrites the manifest with its single entry changed by `edit`, and expects load to refuse.
  void expect_refused(const std::function<void(json&)>& edit, const std::vector<std::string>& substrings) {
    json m = manifest_with({entry_});
    edit(m);
    write_manifest(dir_, m);
    SCOPED_TRACE(m.dump().substr(0, 120));
    expect_error([&] { AotManifest::load(dir_.path()); }, Status::kBundleError, substrings);
  }
  std::string manifest_path() const { return dir_.file("manifest.json"); }
  std::string cubin_path() const { return dir_.file(entry_["cubin"].get<std::string>()); }

  // A cubin whose content is bad: the manifest still loads (the cubin is read on first use),
  // and each way of reading it refuses it with Error(kBundleError) holding every substring:
  // KernelMetadata::image, AotManifest::verify_cubins and load with CubinCheck::kNow.
  void expect_cubin_refused(const std::vector<std::string>& substrings) {
    const AotManifest m = AotManifest::load(dir_.path());
    ASSERT_EQ(m.kernels().size(), 1u);
    EXPECT_FALSE(m.kernels()[0].image_verified());
    expect_error([&] { m.kernels()[0].image(); }, Status::kBundleError, substrings);
    EXPECT_FALSE(m.kernels()[0].image_verified());
    expect_error([&] { m.verify_cubins(); }, Status::kBundleError, substrings);
    expect_error([&] { AotManifest::load(dir_.path(), luminav::CubinCheck::kNow); }, Status::kBundleError,
                 substrings);
  }

  TempDir dir_;
  json entry_;
};

TEST_F(ManifestTest, LoadsAValidBundle) {
  const AotManifest m = AotManifest::load(dir_.path());
  EXPECT_EQ(m.format_version(), 2);
  EXPECT_EQ(m.table_cols(), 18);
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

TEST_F(ManifestTest, ConstexprBooleansReadAsIntegers) {
  json m = manifest_with({entry_});
  m["kernels"][0]["constexprs"]["SR"] = true;
  m["kernels"][0]["constexprs"]["USE_CLIP"] = false;
  write_manifest(dir_, m);
  const AotManifest loaded = AotManifest::load(dir_.path());
  EXPECT_EQ(loaded.kernels()[0].constexprs.at("SR"), 1);
  EXPECT_EQ(loaded.kernels()[0].constexprs.at("USE_CLIP"), 0);
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
  expect_error([&] { AotManifest::load(dir_.path()); }, Status::kBundleError, {manifest_path(), "not valid JSON"});
  write_text(manifest_path(), "\x89PNG\r\n\x1a\n binary garbage \xff\xfe");
  expect_error([&] { AotManifest::load(dir_.path()); }, Status::kBundleError, {manifest_path(), "not valid JSON"});
}

TEST_F(ManifestTest, RefusesAnEmptyOrMissingManifest) {
  write_text(manifest_path(), "");
  expect_error([&] { AotManifest::load(dir_.path()); }, Status::kBundleError, {manifest_path(), "empty (0 bytes)"});
  std::filesystem::remove(manifest_path());
  expect_error([&] { AotManifest::load(dir_.path()); }, Status::kBundleError,
               {manifest_path(), "cannot open", "luminamoon aot build"});
  expect_error([&] { AotManifest::load(dir_.file("no-such-bundle")); }, Status::kBundleError,
               {"no-such-bundle/manifest.json", "cannot open"});
}

TEST_F(ManifestTest, RefusesANonObjectTopLevel) {
  write_text(manifest_path(), "[1, 2, 3]");
  expect_error([&] { AotManifest::load(dir_.path()); }, Status::kBundleError,
               {manifest_path(), "expected a JSON object", "found an array of 3"});
}

TEST_F(ManifestTest, RefusesAMissingOrUnknownFormat) {
  expect_refused([](json& m) { m.erase("format"); },
                 {manifest_path(), "field \"format\"", "expected a string", "the field is missing"});
  expect_refused([](json& m) { m["format"] = "other-bundle"; },
                 {manifest_path(), "field \"format\"", "\"luminamoon-aot-bundle\"", "found \"other-bundle\""});
}

TEST_F(ManifestTest, RefusesANewerOrMissingFormatVersion) {
  expect_refused([](json& m) { m["format_version"] = 3; },
                 {manifest_path(), "field \"format_version\"", "expected at most 2", "found integer 3", "update luminav"});
  expect_refused([](json& m) { m.erase("format_version"); },
                 {"field \"format_version\"", "the field is missing"});
  expect_refused([](json& m) { m["format_version"] = "1"; },
                 {"field \"format_version\"", "expected an integer", "found string \"1\""});
  expect_refused([](json& m) { m["format_version"] = 0; }, {"field \"format_version\"", "found integer 0"});
}

TEST_F(ManifestTest, TableColsIsRequiredFromVersion2AndImpliedByVersion1) {
  expect_refused([](json& m) { m.erase("table_cols"); }, {"field \"table_cols\"", "the field is missing"});
  expect_refused([](json& m) { m["table_cols"] = "18"; }, {"field \"table_cols\"", "found string \"18\""});
  expect_refused([](json& m) { m["table_cols"] = 0; }, {"field \"table_cols\"", "found integer 0"});
  json v1 = json::parse(read_text(manifest_path()));
  v1["format_version"] = 1;
  v1.erase("table_cols");
  write_text(manifest_path(), v1.dump());
  const AotManifest m = AotManifest::load(dir_.path());
  EXPECT_EQ(m.format_version(), 1);
  EXPECT_EQ(m.table_cols(), luminav::kAotBundleV1TableCols);
}

TEST_F(ManifestTest, RefusesMissingOrEmptyKernels) {
  expect_refused([](json& m) { m.erase("kernels"); }, {"field \"kernels\"", "the field is missing"});
  expect_refused([](json& m) { m["kernels"] = json::object(); }, {"field \"kernels\"", "found an object"});
  expect_refused([](json& m) { m["kernels"] = json::array(); }, {"field \"kernels\"", "found an empty array"});
  expect_refused([](json& m) { m["kernels"][0] = 7; }, {"kernels[0]", "expected an object", "found integer 7"});
}

// ---------------------------------------------------------------------------------------------
// Refusals of one kernel entry.

TEST_F(ManifestTest, RefusesEveryMissingKernelField) {
  for (const char* field : {"key", "kernel", "name", "entry", "cubin", "sha256", "target", "triton_version",
                            "num_warps", "num_ctas", "num_stages", "shared_mem", "arg_names", "signature",
                            "constexprs", "num_params", "num_trailing_scratch_ptrs", "global_scratch_size",
                            "global_scratch_align", "profile_scratch_size", "profile_scratch_align"}) {
    SCOPED_TRACE(field);
    expect_refused([&](json& m) { m["kernels"][0].erase(field); },
                   {manifest_path(), "kernels[0]", std::string("field \"") + field + "\"", "the field is missing"});
  }
  for (const char* field : {"backend", "arch", "warp_size"}) {
    SCOPED_TRACE(field);
    expect_refused([&](json& m) { m["kernels"][0]["target"].erase(field); },
                   {"kernels[0]", "target", std::string("field \"") + field + "\"", "the field is missing"});
  }
}

TEST_F(ManifestTest, RefusesWrongFieldTypes) {
  const std::string where = std::string("kernels[0] (key \"") + kPass2Key + "\")";
  expect_refused([](json& m) { m["kernels"][0]["num_warps"] = "8"; },
                 {manifest_path(), where, "field \"num_warps\"", "expected an integer in [1, 32]", "found string \"8\""});
  expect_refused([](json& m) { m["kernels"][0]["num_params"] = 15.0; },
                 {"field \"num_params\"", "expected an integer", "found number 15.0"});
  expect_refused([](json& m) { m["kernels"][0]["key"] = 42; },
                 {"kernels[0]", "field \"key\"", "expected a string", "found integer 42"});
  expect_refused([](json& m) { m["kernels"][0]["signature"] = "*i64,*i32"; },
                 {"field \"signature\"", "expected an array of strings", "found string"});
  expect_refused([](json& m) { m["kernels"][0]["arg_names"][4] = 5; },
                 {"field \"arg_names[4]\"", "expected a string", "found integer 5"});
  expect_refused([](json& m) { m["kernels"][0]["target"] = "sm_90"; },
                 {"field \"target\"", "expected an object", "found string \"sm_90\""});
  expect_refused([](json& m) { m["kernels"][0]["target"]["arch"] = "90"; },
                 {"target", "field \"arch\"", "expected an integer", "found string \"90\""});
  expect_refused([](json& m) { m["kernels"][0]["constexprs"]["BLOCK"] = 1.5; },
                 {"field \"constexprs.BLOCK\"", "expected an integer or a boolean", "found number 1.5"});
  expect_refused([](json& m) { m["kernels"][0]["constexprs"] = json::array(); },
                 {"field \"constexprs\"", "expected an object of integers", "found an array of 0"});
  expect_refused([](json& m) { m["kernels"][0]["shared_mem"] = nullptr; },
                 {"field \"shared_mem\"", "found null"});
}

TEST_F(ManifestTest, RefusesValuesOutOfRange) {
  expect_refused([](json& m) { m["kernels"][0]["shared_mem"] = -1; },
                 {"field \"shared_mem\"", "expected an integer in [0, ", "found integer -1"});
  expect_refused([](json& m) { m["kernels"][0]["global_scratch_size"] = -8; },
                 {"field \"global_scratch_size\"", "found integer -8"});
  expect_refused([](json& m) { m["kernels"][0]["profile_scratch_size"] = -1; },
                 {"field \"profile_scratch_size\"", "found integer -1"});
  expect_refused([](json& m) { m["kernels"][0]["global_scratch_align"] = 3; },
                 {"field \"global_scratch_align\"", "expected a power of two", "found 3"});
  expect_refused([](json& m) { m["kernels"][0]["num_warps"] = 6; },
                 {"field \"num_warps\"", "expected a power of two", "found 6"});
  expect_refused([](json& m) { m["kernels"][0]["target"]["warp_size"] = 64; },
                 {"field \"warp_size\"", "expected an integer in [32, 32]", "found integer 64"});
  expect_refused([](json& m) { m["kernels"][0]["target"]["backend"] = "hip"; },
                 {"field \"backend\"", "expected \"cuda\"", "found \"hip\""});
  expect_refused([](json& m) { m["kernels"][0]["kernel"] = "pass3"; },
                 {"field \"kernel\"", "one of pass1, reduce, pass2, single_pass, commit", "found \"pass3\""});
  expect_refused([](json& m) { m["kernels"][0]["sha256"] = std::string(64, 'A'); },
                 {"field \"sha256\"", "64 lowercase hex digits"});
  expect_refused([](json& m) { m["kernels"][0]["cubin"] = "../elsewhere.cubin"; },
                 {"field \"cubin\"", "no path separators", "found \"../elsewhere.cubin\""});
  expect_refused([](json& m) { m["kernels"][0]["num_trailing_scratch_ptrs"] = 3; m["kernels"][0]["num_params"] = 16; },
                 {"field \"num_trailing_scratch_ptrs\"", "expected an integer in [0, 2]", "found integer 3"});
}

TEST_F(ManifestTest, RefusesAnArgumentCountOffByOne) {
  expect_refused([](json& m) { m["kernels"][0]["num_params"] = 16; },
                 {manifest_path(), "field \"num_params\"",
                  "expected 15 (len(signature) 13 + num_trailing_scratch_ptrs 2)", "found 16"});
  expect_refused([](json& m) { m["kernels"][0]["num_params"] = 14; }, {"field \"num_params\"", "found 14"});
  // Dropping one signature entry (and its name) leaves num_params one too many.
  expect_refused(
      [](json& m) {
        m["kernels"][0]["signature"].erase(12);
        m["kernels"][0]["arg_names"].erase(12);
      },
      {"field \"num_params\"", "expected 14 (len(signature) 12", "found 15"});
  expect_refused([](json& m) { m["kernels"][0]["arg_names"].erase(0); },
                 {"field \"signature\"", "one type word per arg_names entry (12)", "found 13 entries"});
}

TEST_F(ManifestTest, RefusesUnknownTypeWords) {
  expect_refused([](json& m) { m["kernels"][0]["signature"][2] = "*fp33"; },
                 {"field \"signature[2]\"", "a Triton type word", "found \"*fp33\""});
  expect_refused([](json& m) { m["kernels"][0]["signature"][5] = "constexpr"; },
                 {"field \"signature[5]\"", "found \"constexpr\""});
  expect_refused([](json& m) { m["kernels"][0]["signature"][5] = "fp8e5"; },  // only a pointee type
                 {"field \"signature[5]\"", "found \"fp8e5\""});
  expect_refused([](json& m) { m["kernels"][0]["signature"][0] = ""; }, {"field \"signature[0]\"", "found \"\""});
}

TEST_F(ManifestTest, RefusesScratchWithoutItsTrailingPointer) {
  expect_refused(
      [](json& m) {
        m["kernels"][0]["num_trailing_scratch_ptrs"] = 0;
        m["kernels"][0]["num_params"] = 13;
        m["kernels"][0]["global_scratch_size"] = 128;
      },
      {"field \"num_trailing_scratch_ptrs\"", "at least 1 (global_scratch_size is 128", "found 0"});
  expect_refused(
      [](json& m) {
        m["kernels"][0]["num_trailing_scratch_ptrs"] = 1;
        m["kernels"][0]["num_params"] = 14;
        m["kernels"][0]["profile_scratch_size"] = 64;
      },
      {"field \"num_trailing_scratch_ptrs\"", "expected 2 (profile_scratch_size is 64", "found 1"});
}

TEST_F(ManifestTest, RefusesADuplicateVariant) {
  json m = manifest_with({entry_, entry_});
  write_manifest(dir_, m);
  expect_error([&] { AotManifest::load(dir_.path()); }, Status::kBundleError,
               {"kernels[1]", "field \"key\"", "one entry per (key, arch)", "for arch 90"});
}

// ---------------------------------------------------------------------------------------------
// Refusals of the cubin file.

TEST_F(ManifestTest, RefusesAHashMismatch) {
  const std::string recorded = entry_["sha256"];
  write_bytes(cubin_path(), make_fake_cubin("tampered"));
  const auto now = make_fake_cubin("tampered");
  expect_cubin_refused({manifest_path(), "kernels[0] (key \"" + std::string(kPass2Key) + "\")", "field \"sha256\"",
                        "expected " + recorded, "found " + luminav::sha256_hex(now.data(), now.size()), cubin_path(),
                        "rebuild the bundle"});
  write_bytes(cubin_path(), make_fake_cubin("cubin of " + entry_["cubin"].get<std::string>()));  // the original
  json m = manifest_with({entry_});
  m["kernels"][0]["sha256"] = std::string(64, 'f');
  write_manifest(dir_, m);
  expect_cubin_refused({"field \"sha256\"", "expected " + std::string(64, 'f')});
}

TEST_F(ManifestTest, ARefusedCubinIsReadAgainAndAVerifiedOneIsNot) {
  const std::vector<unsigned char> good = make_fake_cubin("cubin of " + entry_["cubin"].get<std::string>());
  write_bytes(cubin_path(), make_fake_cubin("tampered"));
  const AotManifest m = AotManifest::load(dir_.path());
  const luminav::KernelMetadata& k = m.kernels()[0];
  expect_error([&] { k.image(); }, Status::kBundleError, {"field \"sha256\""});
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
  expect_error([&] { m.verify_cubins(); }, Status::kBundleError,
               {"kernels[1]", "field \"sha256\"", dir.file(entries[1]["cubin"].get<std::string>())});
  expect_error([&] { AotManifest::load(dir.path(), luminav::CubinCheck::kNow); }, Status::kBundleError,
               {"kernels[1]", "field \"sha256\""});
}

TEST_F(ManifestTest, RefusesAMissingCubin) {
  std::filesystem::remove(cubin_path());
  expect_error([&] { AotManifest::load(dir_.path()); }, Status::kBundleError,
               {manifest_path(), "field \"cubin\"", "a readable file \"" + cubin_path() + "\"", "no such file"});
}

TEST_F(ManifestTest, RefusesACubinRemovedAfterLoadWhenItIsRead) {
  const AotManifest m = AotManifest::load(dir_.path());
  std::filesystem::remove(cubin_path());
  expect_error([&] { m.kernels()[0].image(); }, Status::kBundleError,
               {manifest_path(), "field \"cubin\"", "a readable file \"" + cubin_path() + "\"", "no such file"});
}

TEST_F(ManifestTest, RefusesACubinThatIsADirectory) {
  std::filesystem::remove(cubin_path());
  std::filesystem::create_directory(cubin_path());
  expect_error([&] { AotManifest::load(dir_.path()); }, Status::kBundleError,
               {manifest_path(), "field \"cubin\"", "a regular file \"" + cubin_path() + "\""});
}

TEST_F(ManifestTest, RefusesAnEmptyCubin) {
  write_bytes(cubin_path(), {});
  expect_error([&] { AotManifest::load(dir_.path()); }, Status::kBundleError,
               {manifest_path(), cubin_path(), "is empty (0 bytes)"});
}

TEST_F(ManifestTest, RefusesATruncatedCubin) {
  std::ifstream f(cubin_path(), std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  f.close();
  const std::size_t full = bytes.size();
  for (const std::size_t keep : {full - 1, full - 64, full - 130, std::size_t{70}, std::size_t{40}}) {
    SCOPED_TRACE(keep);
    write_bytes(cubin_path(), std::vector<unsigned char>(bytes.begin(), bytes.begin() + static_cast<long>(keep)));
    expect_cubin_refused({cubin_path(), "(" + std::to_string(keep) + " bytes)", "truncated"});
  }
}

TEST_F(ManifestTest, RefusesACubinThatIsNotElf) {
  std::vector<unsigned char> text(200, 'x');
  write_bytes(cubin_path(), text);
  expect_cubin_refused({cubin_path(), "not an ELF file"});
}

TEST_F(ManifestTest, RefusesAnElfFileForAnotherMachine) {
  std::vector<unsigned char> bytes = make_fake_cubin("host code");
  bytes[0x12] = 62;  // EM_X86_64
  bytes[0x13] = 0;
  write_bytes(cubin_path(), bytes);
  expect_cubin_refused({cubin_path(), "ELF file for machine 62, not a CUDA cubin"});
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

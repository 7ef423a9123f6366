// tests/test_hsaco.cpp: the AMD code object reader (aot/hsaco.h) on real Triton code objects and
// on corrupt ones, and the manifest's HIP entries checked against their code objects
// (manifest_hsaco.cpp): each refusal with its code, file and field
#include <gtest/gtest.h>

#include <functional>
#include <tuple>
#include <string>
#include <vector>

#include "aot/hsaco.h"
#include "aot/manifest.h"
#include "fakes/expect_error.h"
#include "fakes/fake_bundle.h"
#include "fakes/fake_hsaco.h"

namespace {

using luminav::AotManifest;
using luminav::BundleRule;
using luminav::CubinCheck;
using luminav_test::add_hip_variant;
using luminav_test::add_variant;
using luminav_test::expect_refusal;
using luminav_test::FakeHsaco;
using luminav_test::json;
using luminav_test::kPass2Key;
using luminav_test::make_fake_hsaco;
using luminav_test::manifest_v3_with;
using luminav_test::read_bytes;
using luminav_test::TempDir;
using luminav_test::write_bytes;
using luminav_test::write_manifest;
namespace hsaco = luminav::hsaco;

// Compiled by Triton 3.6.0 for GPUTarget("hip", arch, 64), num_warps 4: scale_kernel(x_ptr *fp32,
// y_ptr *fp32, n i32, alpha fp32, BLOCK constexpr) (the fuzz target's seeds).
std::vector<unsigned char> real_hsaco(const std::string& arch) {
  return read_bytes(std::string(LUMINAV_HSACO_SEEDS_DIR) + "/scale." + arch + ".hsaco");
}

TEST(Hsaco, ReadsTritonsCodeObjects) {
  for (const std::string arch : {"gfx942", "gfx90a"}) {
    SCOPED_TRACE(arch);
    const auto bytes = real_hsaco(arch);
    const hsaco::HsacoInfo info = hsaco::parse_hsaco(bytes.data(), bytes.size());
    EXPECT_EQ(info.arch, arch);
    EXPECT_EQ(info.mach, hsaco::arch_mach(arch));
    EXPECT_NE(info.target.find(arch), std::string::npos) << info.target;
    ASSERT_EQ(info.kernels.size(), 1u);
    const hsaco::Kernel& k = info.kernels[0];
    EXPECT_EQ(k.name, "scale_kernel");
    EXPECT_EQ(k.symbol.value_or(""), "scale_kernel.kd");
    bool descriptor = false;
    for (const auto& s : info.dynsym) descriptor = descriptor || (s.name == "scale_kernel.kd" && s.type == 1 && s.bind == 1);
    EXPECT_TRUE(descriptor);
    ASSERT_TRUE(k.wavefront_size.has_value());
    EXPECT_EQ(*k.wavefront_size, 64);
    // 4 user arguments + Triton 3.6's global_scratch and profile_scratch
    EXPECT_EQ(k.explicit_args().size(), 6u);
    ASSERT_EQ(k.args.size(), 6u);
    EXPECT_EQ(k.args[0].value_kind, "global_buffer");
    EXPECT_EQ(k.args[2].value_kind, "by_value");
    EXPECT_EQ(k.args[2].offset, 16u);
    EXPECT_EQ(k.args[3].size, 4u);
    EXPECT_EQ(k.args[5].offset, 32u);
  }
}

TEST(Hsaco, CountsOnlyExplicitArguments) {
  FakeHsaco spec;
  spec.args = luminav_test::hsaco_args({"*fp32", "i32"}, 2, 3);
  const auto bytes = make_fake_hsaco(spec);
  const hsaco::HsacoInfo info = hsaco::parse_hsaco(bytes.data(), bytes.size());
  ASSERT_EQ(info.kernels_named("k").size(), 1u);
  EXPECT_EQ(info.kernels_named("k")[0]->args.size(), 7u);
  EXPECT_EQ(info.kernels_named("k")[0]->explicit_args().size(), 4u);
}

// Every prefix and many single-byte corruptions of a real code object: refused as an ElfError or
// read, never past the end (the sanitizer builds would see it).
TEST(Hsaco, NeverReadsPastACorruptFile) {
  const auto bytes = real_hsaco("gfx942");
  for (std::size_t n = 0; n < bytes.size(); n += 7) {
    try {
      (void)hsaco::parse_hsaco(bytes.data(), n);
    } catch (const luminav::elf::ElfError&) {
    }
  }
  for (std::size_t at = 0; at < bytes.size(); at += 3) {
    auto bad = bytes;
    bad[at] ^= 0xa5;
    try {
      (void)hsaco::parse_hsaco(bad.data(), bad.size());
    } catch (const luminav::elf::ElfError&) {
    }
  }
  EXPECT_THROW(hsaco::parse_hsaco(bytes.data(), 40), luminav::elf::ElfError);
}

class HsacoManifest : public ::testing::Test {
 protected:
  // A bundle of one HIP pass-2 entry for gfx942; `edit` changes the code object's spec, the entry
  // keeps the hash of what was written.
  std::string bundle_with(const std::function<void(FakeHsaco&)>& edit, json* entry_out = nullptr) {
    json e = add_hip_variant(dir_, kPass2Key);
    const std::string file = e["hsaco"];
    const luminav_test::KernelSpec spec = luminav_test::kernel_spec("pass2");
    FakeHsaco h;
    h.name = spec.name;
    h.args = luminav_test::hsaco_args(spec.signature, 2, 2);
    edit(h);
    const auto bytes = make_fake_hsaco(h);
    write_bytes(dir_.file(file), bytes);
    e["sha256"] = luminav::sha256_hex(bytes.data(), bytes.size());
    if (entry_out) *entry_out = e;
    write_manifest(dir_, manifest_v3_with({e}));
    return dir_.file(file);
  }
  void expect_refused(const std::function<void(FakeHsaco&)>& edit, BundleRule rule, const std::string& field,
                      std::vector<std::string> text) {
    const std::string file = bundle_with(edit);
    text.push_back(file);
    expect_refusal([&] { (void)AotManifest::load(dir_.path(), CubinCheck::kNow); }, rule, field, text);
    try {
      (void)AotManifest::load(dir_.path(), CubinCheck::kNow);
    } catch (const luminav::BundleError& e) {
      EXPECT_EQ(e.file(), file);
    }
  }
  TempDir dir_;
};

TEST_F(HsacoManifest, LoadsAHipEntryAndFindsItByArch) {
  json e = add_hip_variant(dir_, kPass2Key, "gfx942");
  json e90a = add_hip_variant(dir_, kPass2Key, "gfx90a");
  json cuda = add_variant(dir_, kPass2Key, 90);
  write_manifest(dir_, manifest_v3_with({e, e90a, cuda}));
  const AotManifest m = AotManifest::load(dir_.path(), CubinCheck::kNow);
  EXPECT_EQ(m.format_version(), 3);
  ASSERT_EQ(m.kernels().size(), 3u);
  const luminav::KernelMetadata& k = m.kernels()[0];
  EXPECT_TRUE(k.hip());
  EXPECT_EQ(k.gfx, "gfx942");
  EXPECT_EQ(k.warp_size, 64);
  EXPECT_EQ(k.block_threads(), 8 * 64);
  EXPECT_EQ(k.cubin, std::string(kPass2Key) + ".gfx942.hsaco");
  EXPECT_EQ(m.find_hip(kPass2Key, "gfx90a"), &m.kernels()[1]);
  EXPECT_EQ(m.find_hip(kPass2Key, "gfx950"), nullptr);
  // a CUDA device never gets a HIP entry, and the other way round
  EXPECT_EQ(m.find(kPass2Key, 9, 0), &m.kernels()[2]);
  EXPECT_EQ(m.archs_for(kPass2Key), std::vector<int>{90});
  luminav_test::expect_error([&] { (void)m.require_hip(kPass2Key, "gfx950"); }, luminav::Status::kNotFound,
                             {"gfx950", "the bundle has it for gfx942, gfx90a", "luminamoon aot build --arch gfx950"});
}

TEST_F(HsacoManifest, AcceptsARealTritonCodeObject) {
  const auto bytes = real_hsaco("gfx942");
  const luminav_test::KernelSpec spec{"pass2", "scale_kernel", {"x_ptr", "y_ptr", "n", "alpha"},
                                      {"*fp32", "*fp32", "i32", "fp32"}};
  luminav_test::VariantOptions options;
  options.spec = spec;
  // compiled at num_warps 4: its .max_flat_workgroup_size is 256
  const std::string key = "pass2.p1g1s0.sr1.b2.c1.f1.B2048.w4";
  json e = add_hip_variant(dir_, key, "gfx942", options);
  write_bytes(dir_.file(e["hsaco"]), bytes);
  e["sha256"] = luminav::sha256_hex(bytes.data(), bytes.size());
  write_manifest(dir_, manifest_v3_with({e}));
  const AotManifest m = AotManifest::load(dir_.path(), CubinCheck::kNow);
  EXPECT_TRUE(m.kernels()[0].image_verified());
  // the same bytes named gfx90a: refused for its arch
  e["target"]["arch"] = "gfx90a";
  e["hsaco"] = key + ".gfx90a.hsaco";
  write_bytes(dir_.file(e["hsaco"]), bytes);
  write_manifest(dir_, manifest_v3_with({e}));
  expect_refusal([&] { (void)AotManifest::load(dir_.path(), CubinCheck::kNow); }, BundleRule::kArch,
                 "kernels[0].target.arch", {"gfx942 (the code object's e_flags & 0xff = 0x4c)", "found gfx90a"});
}

TEST_F(HsacoManifest, RefusesAnotherKernel) {
  expect_refused([](FakeHsaco& h) { h.name = "x"; }, BundleRule::kNoEntrySymbol, "kernels[0].entry",
                 {"one kernel \"_lumina_tdclm_pass2_kernel\" in the metadata note", "kernels [\"x\"]"});
}

TEST_F(HsacoManifest, RefusesACorruptElf) {
  json e;
  const std::string file = bundle_with([](FakeHsaco&) {}, &e);
  auto bytes = read_bytes(file);
  for (int cut : {0, 1, 40, 100}) {
    SCOPED_TRACE(cut);
    std::vector<unsigned char> part(bytes.begin(), bytes.begin() + cut);
    write_bytes(file, part);
    e["sha256"] = luminav::sha256_hex(part.data(), part.size());
    write_manifest(dir_, manifest_v3_with({e}));
    expect_refusal([&] { (void)AotManifest::load(dir_.path(), CubinCheck::kNow); }, BundleRule::kTruncated,
                   "kernels[0].hsaco", {file});
  }
  auto bad = bytes;
  bad[18] = 190;  // e_machine: CUDA
  write_bytes(file, bad);
  e["sha256"] = luminav::sha256_hex(bad.data(), bad.size());
  write_manifest(dir_, manifest_v3_with({e}));
  expect_refusal([&] { (void)AotManifest::load(dir_.path(), CubinCheck::kNow); }, BundleRule::kElfHeader,
                 "kernels[0].hsaco", {file, "expected e_machine EM_AMDGPU (224), found 190"});
}

TEST_F(HsacoManifest, RefusesAWrongNote) {
  expect_refused([](FakeHsaco& h) { h.note = false; }, BundleRule::kHsacoNote, "kernels[0].hsaco",
                 {"0 NT_AMDGPU_METADATA notes"});
  expect_refused([](FakeHsaco& h) { h.metadata = std::string("\xc1\xc1\xc1", 3); }, BundleRule::kHsacoNote,
                 "kernels[0].hsaco", {"the metadata note is not one msgpack value"});
  expect_refused([](FakeHsaco& h) { h.metadata = std::string("\x81\xae" "amdhsa.kernels" "\x07", 17); },
                 BundleRule::kHsacoNote, "kernels[0].hsaco", {"not a map with an amdhsa.kernels array"});
  expect_refused([](FakeHsaco& h) { h.metadata = std::string("\x81\xae" "amdhsa.kernels" "\x90" "\x00", 18); },
                 BundleRule::kHsacoNote, "kernels[0].hsaco", {"1 bytes after it"});
  expect_refused([](FakeHsaco& h) { h.metadata = std::string("\x82\xa1x\x01\xa1x\x02", 7); }, BundleRule::kHsacoNote,
                 "kernels[0].hsaco", {"map key \"x\" twice"});
  expect_refused([](FakeHsaco& h) { h.metadata = std::string("\x81\xa2\xc3\x28\x01", 5); }, BundleRule::kHsacoNote,
                 "kernels[0].hsaco", {"not UTF-8"});
  // 17 nested arrays
  expect_refused([](FakeHsaco& h) { h.metadata = std::string(17, '\x91') + '\x01'; }, BundleRule::kHsacoNote,
                 "kernels[0].hsaco", {"nests deeper than 16"});
  // an array header claiming 2^32-1 entries: refused, not allocated
  expect_refused([](FakeHsaco& h) { h.metadata = std::string("\x81\xae" "amdhsa.kernels" "\xdd\xff\xff\xff\xff", 21); },
                 BundleRule::kHsacoNote, "kernels[0].hsaco", {"not one msgpack value"});
}

TEST_F(HsacoManifest, RefusesAWrongArgumentCount) {
  expect_refused([](FakeHsaco& h) { h.args.pop_back(); h.args.pop_back(); h.args.pop_back(); },
                 BundleRule::kParamMismatch, "kernels[0].num_params",
                 {"expected 14", "whose .value_kind is not hidden_*", "found 15"});
  // the count right, a size wrong: the layout
  expect_refused([](FakeHsaco& h) { h.args[1].size = 4; }, BundleRule::kParamMismatch, "kernels[0].signature",
                 {"an ABI mismatch"});
  // hidden arguments are not counted: two more of them change nothing
  bundle_with([](FakeHsaco& h) { h.args.push_back({"hidden_printf_buffer", 8}); });
  EXPECT_NO_THROW((void)AotManifest::load(dir_.path(), CubinCheck::kNow));
}

TEST_F(HsacoManifest, RefusesAWrongArch) {
  expect_refused([](FakeHsaco& h) { h.mach = 0x3f; }, BundleRule::kArch, "kernels[0].target.arch",
                 {"expected gfx90a (the code object's e_flags & 0xff = 0x3f)", "found gfx942"});
  expect_refused([](FakeHsaco& h) { h.mach = 0x41; }, BundleRule::kArch, "kernels[0].target.arch",
                 {"an unknown arch (the code object's e_flags & 0xff = 0x41)"});
}

TEST_F(HsacoManifest, RefusesAWrongWavefrontSize) {
  expect_refused([](FakeHsaco& h) { h.wavefront_size = 32; }, BundleRule::kWavefrontSize,
                 "kernels[0].target.warp_size", {"expected 32 (the kernel's .wavefront_size)", "found 64"});
  expect_refused([](FakeHsaco& h) { h.wavefront_size = 0; }, BundleRule::kWavefrontSize, "kernels[0].target.warp_size",
                 {"expected no (the kernel's .wavefront_size)"});
}

TEST_F(HsacoManifest, RefusesASmallerMaximumBlock) {
  // pass 2 at num_warps 8: 512 threads
  expect_refused([](FakeHsaco& h) { h.max_flat_workgroup_size = 256; }, BundleRule::kLaunchShape, "kernels[0].num_warps",
                 {"at most 256 threads (the kernel's .max_flat_workgroup_size)", "found 512 threads"});
  bundle_with([](FakeHsaco& h) { h.max_flat_workgroup_size = 512; });
  EXPECT_NO_THROW((void)AotManifest::load(dir_.path(), CubinCheck::kNow));
}

TEST_F(HsacoManifest, RefusesAMissingDescriptorSymbol) {
  expect_refused([](FakeHsaco& h) { h.descriptor_symbol = false; }, BundleRule::kNoEntrySymbol, "kernels[0].entry",
                 {"_lumina_tdclm_pass2_kernel.kd\" in .dynsym", "0 such symbols"});
  expect_refused([](FakeHsaco& h) { h.symbol = "other.kd"; }, BundleRule::kNoEntrySymbol, "kernels[0].entry",
                 {"its .symbol \"other.kd\""});
}

TEST_F(HsacoManifest, RefusesBadHipEntries) {
  json e = add_hip_variant(dir_, kPass2Key);
  const std::vector<std::tuple<std::function<void(json&)>, BundleRule, std::string, std::string>> cases = {
      {[](json& k) { k["target"]["arch"] = "gfx1100"; }, BundleRule::kHipTarget, "target.arch",
       "one of gfx90a, gfx942, gfx950"},
      {[](json& k) { k["target"]["arch"] = 942; }, BundleRule::kBadType, "target.arch", "a string"},
      {[](json& k) { k["target"]["warp_size"] = 32; }, BundleRule::kHipTarget, "target.warp_size", "expected 64"},
      {[](json& k) { k["hsaco"] = "other.gfx942.hsaco"; }, BundleRule::kKeyMismatch, "hsaco", ".gfx942.hsaco"},
      {[](json& k) { k.erase("hsaco"); }, BundleRule::kMissingField, "hsaco", "required"},
  };
  for (const auto& [edit, rule, field, text] : cases) {
    SCOPED_TRACE(field);
    json k = e;
    edit(k);
    write_manifest(dir_, manifest_v3_with({k}));
    expect_refusal([&] { (void)AotManifest::load(dir_.path()); }, rule, "kernels[0]." + field, {text});
  }
  json v2 = manifest_v3_with({e});
  v2["format_version"] = 2;
  write_manifest(dir_, v2);
  expect_refusal([&] { (void)AotManifest::load(dir_.path()); }, BundleRule::kHipTarget, "kernels[0].target.backend",
                 {"format_version 2"});
  write_manifest(dir_, manifest_v3_with({e, e}));
  expect_refusal([&] { (void)AotManifest::load(dir_.path()); }, BundleRule::kDuplicate, "kernels[1]", {"gfx942"});
}

}  // namespace

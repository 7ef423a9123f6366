// tests/test_bundle_file.cpp: reading a bundle's files (src/aot/bundle_file.cpp)
//
// Only regular files inside the bundle are read, with a size limit, never blocking: a FIFO, a
// device, a directory, a link that leaves the folder, a dangling link, a link loop, a file over
// the limit are each refused with their rule book code before any data is read.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "aot/bundle_file.h"
#include "aot/bundle_rules.h"
#include "fakes/expect_error.h"
#include "fakes/fake_bundle.h"

using luminav::BundleRule;
using luminav::read_bundle_file;
using luminav::stat_bundle_file;
using namespace luminav_test;
namespace fs = std::filesystem;

class BundleFileTest : public ::testing::Test {
 protected:
  void SetUp() override { write_text(dir_.file("a.cubin"), "0123456789"); }
  void expect_refused(const std::string& name, BundleRule rule, const std::string& found) {
    expect_refusal([&] { read_bundle_file(dir_.path(), name, 100, "kernels[0].cubin"); }, rule, "kernels[0].cubin",
                   {dir_.file(name), found});
    expect_refusal([&] { stat_bundle_file(dir_.path(), name, 100, "kernels[0].cubin"); }, rule, "kernels[0].cubin");
  }
  TempDir dir_;
};

TEST_F(BundleFileTest, ReadsARegularFileAndALinkInsideTheBundle) {
  EXPECT_EQ(read_bundle_file(dir_.path(), "a.cubin", 100, "f").size(), 10u);
  EXPECT_EQ(stat_bundle_file(dir_.path(), "a.cubin", 100, "f"), 10u);
  fs::create_symlink("a.cubin", dir_.file("b.cubin"));
  EXPECT_EQ(read_bundle_file(dir_.path(), "b.cubin", 100, "f").size(), 10u);
  write_text(dir_.file("empty"), "");
  EXPECT_TRUE(read_bundle_file(dir_.path(), "empty", 100, "f").empty());
}

TEST_F(BundleFileTest, ReadsUpToTheLimitAndRefusesOneByteMore) {
  EXPECT_EQ(read_bundle_file(dir_.path(), "a.cubin", 10, "f").size(), 10u);
  expect_refusal([&] { read_bundle_file(dir_.path(), "a.cubin", 9, "f"); }, BundleRule::kTooLarge, "f",
                 {"at most 9 bytes", "found 10 bytes"});
  ASSERT_EQ(::truncate(dir_.file("a.cubin").c_str(), off_t{1} << 40), 0);  // sparse: 1 TiB
  expect_refused("a.cubin", BundleRule::kTooLarge, "1099511627776 bytes");
}

TEST_F(BundleFileTest, RefusesAFifoWithoutWaitingForAWriter) {
  ASSERT_EQ(::mkfifo(dir_.file("fifo").c_str(), 0600), 0);
  expect_refused("fifo", BundleRule::kNotRegularFile, "found a FIFO");
}

TEST_F(BundleFileTest, RefusesDevicesAndLinksThatLeaveTheBundle) {
  fs::create_symlink("/dev/zero", dir_.file("zero"));
  expect_refused("zero", BundleRule::kNotRegularFile, "outside it");
  fs::create_symlink("/etc/passwd", dir_.file("passwd"));
  expect_refused("passwd", BundleRule::kNotRegularFile, "outside it");
  fs::create_symlink("../" + fs::path(dir_.path()).filename().string() + "/a.cubin", dir_.file("round-trip"));
  EXPECT_EQ(read_bundle_file(dir_.path(), "round-trip", 100, "f").size(), 10u);  // leaves and comes back
}

TEST_F(BundleFileTest, RefusesDirectoriesDanglingLinksAndLoops) {
  fs::create_directory(dir_.file("d"));
  expect_refused("d", BundleRule::kNotRegularFile, "found a directory");
  fs::create_symlink("nothing", dir_.file("dangling"));
  expect_refused("dangling", BundleRule::kMissingFile, "a symbolic link to nothing");
  fs::create_symlink("loop", dir_.file("loop"));
  expect_refused("loop", BundleRule::kUnreadable, "cannot be resolved");
  expect_refused("absent", BundleRule::kMissingFile, "no such file");
}

TEST(BundlePath, JoinsWithOneSlash) {
  EXPECT_EQ(luminav::bundle_path("a", "b"), "a/b");
  EXPECT_EQ(luminav::bundle_path("a/", "b"), "a/b");
  EXPECT_EQ(luminav::bundle_path("", "b"), "b");
}

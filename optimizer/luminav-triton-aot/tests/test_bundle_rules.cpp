// tests/test_bundle_rules.cpp: the rule book's codes and BundleError (src/aot/bundle_rules.cpp)
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "aot/bundle_rules.h"

using luminav::BundleError;
using luminav::BundleRule;

TEST(BundleRules, CodesAreUniqueAndInTheEnumsOrder) {
  std::set<std::string> codes;
  for (int i = 0; i < luminav::kBundleRuleCount; ++i) {
    const auto& r = luminav::bundle_rules()[i];
    EXPECT_EQ(static_cast<int>(r.rule), i);
    EXPECT_TRUE(codes.insert(r.code).second) << r.code;
    EXPECT_STREQ(luminav::bundle_rule_code(r.rule), r.code);
    EXPECT_GT(std::string(r.description).size(), 10u);
  }
  EXPECT_STREQ(luminav::bundle_rule_code(BundleRule::kMissingFile), "missing_file");
  EXPECT_STREQ(luminav::bundle_rule_code(BundleRule::kDevice), "device");
}

TEST(BundleRules, AnErrorCarriesItsPartsAndEndsWithItsCode) {
  const BundleError e(BundleRule::kSha256, "b/x.cubin", "kernels[2].sha256", "abc", "def", "b/manifest.json: no");
  EXPECT_EQ(e.status(), luminav::Status::kBundleError);
  EXPECT_STREQ(e.code(), "sha256");
  EXPECT_EQ(e.file(), "b/x.cubin");
  EXPECT_EQ(e.field(), "kernels[2].sha256");
  EXPECT_EQ(e.expected(), "abc");
  EXPECT_EQ(e.found(), "def");
  EXPECT_STREQ(e.what(), "b/manifest.json: no [sha256]");
}

TEST(BundleRules, PrintableKeepsUtf8AndEscapesTheRest) {
  EXPECT_EQ(luminav::printable("plain"), "plain");
  EXPECT_EQ(luminav::printable("caf\xc3\xa9 \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ(luminav::printable("a\xff" "b"), "a\\xffb");
  EXPECT_EQ(luminav::printable("\xc0\xaf"), "\\xc0\\xaf");          // overlong
  EXPECT_EQ(luminav::printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(luminav::printable("\xe2\x82"), "\\xe2\\x82");          // cut short
  EXPECT_EQ(luminav::printable(std::string("a\0b\n", 4)), "a\\x00b\\x0a");
  EXPECT_EQ(luminav::printable(std::string(500, 'x'), 10), std::string(10, 'x') + "...");
}

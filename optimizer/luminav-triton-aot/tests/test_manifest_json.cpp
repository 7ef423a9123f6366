// tests/test_manifest_json.cpp: the manifest's JSON profile (src/aot/manifest_json.cpp)
//
// UTF-8 JSON without a byte-order mark, lone surrogates or repeated keys, at most 16 deep,
// integers only and each in the int64 range; parsed without recursion, so no input exhausts the
// stack. Python's reader (luminamoon.aot.manifest.parse_manifest_bytes) refuses the same texts.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "aot/manifest_json.h"

using luminav::ManifestJsonError;
using luminav::parse_manifest_json;

namespace {

void expect_refused(const std::string& text, const std::string& why) {
  try {
    parse_manifest_json(text);
    ADD_FAILURE() << "accepted: " << text.substr(0, 80);
  } catch (const ManifestJsonError& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

std::string nested(int depth) { return std::string(static_cast<std::size_t>(depth), '[') + std::string(static_cast<std::size_t>(depth), ']'); }

}  // namespace

TEST(ManifestJson, ParsesTheProfile) {
  const auto doc = parse_manifest_json(R"({"a": [1, -2, "x\u00e9\ud83d\ude00", true, null, {"b": {}}],
                                            "min": -9223372036854775808, "max": 9223372036854775807})");
  EXPECT_EQ(doc["a"][0].get<std::int64_t>(), 1);
  EXPECT_TRUE(doc["max"].is_number_integer());
  EXPECT_EQ(doc["max"].get<std::int64_t>(), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(doc["min"].get<std::int64_t>(), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(doc["a"][2].get<std::string>(), "x\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_NO_THROW(parse_manifest_json(nested(16)));
}

TEST(ManifestJson, RefusesWhatTheProfileForbids) {
  expect_refused("\xef\xbb\xbf{}", "byte-order mark");
  expect_refused("{\"a\": \"\xff\"}", "unparsable");
  expect_refused("{\"a\": \"\xc0\xaf\"}", "unparsable");
  expect_refused("{\"a\": \"\xed\xa0\x80\"}", "unparsable");
  expect_refused(R"({"a": "\ud800"})", "unparsable");
  expect_refused(R"({"a": "\udc00x"})", "unparsable");
  expect_refused(R"({"a": 1, "a": 2})", "twice in one object");
  expect_refused(nested(17), "nesting deeper than 16");
  expect_refused(nested(1000000), "nesting deeper than 16");
  expect_refused(R"({"n": 9223372036854775808})", "outside the int64 range");
  expect_refused(R"({"n": 18446744073709551616})", "not an integer");  // nlohmann reads it as a float
  expect_refused(R"({"n": -9223372036854775809})", "not an integer");
  expect_refused(R"({"n": 1.0})", "not an integer");
  expect_refused(R"({"n": 1e2})", "not an integer");
  expect_refused(R"({"n": 1e400})", "unparsable");
  expect_refused(R"({"n": NaN})", "unparsable");
  expect_refused("", "unparsable");
  expect_refused("{} x", "unparsable");
  expect_refused(std::string("{\"a\": 1} \0 x", 12), "a NUL byte at byte 9");  // nlohmann would stop there
}

TEST(ManifestJson, MessagesAreValidUtf8) {
  try {
    parse_manifest_json("{\"a\xff\xfe\": 1}");
    FAIL();
  } catch (const ManifestJsonError& e) {
    const std::string msg = e.what();
    for (unsigned char c : msg) EXPECT_LT(c, 0x80) << msg;  // the stray bytes are escaped
  }
}

// tests/fakes/expect_error.h: expect_error, the assertion every test of a refusal uses: the
// luminav::Error thrown, its status, and the substrings its message must hold; expect_refusal,
// the same for a bundle refusal with its rule book code and field
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

#include "aot/bundle_rules.h"
#include "luminav/error.h"

namespace luminav_test {

// Expects `fn` to throw luminav::Error with `status` and a message holding every substring.
template <typename Fn>
void expect_error(Fn&& fn, luminav::Status status, const std::vector<std::string>& substrings) {
  try {
    fn();
  } catch (const luminav::Error& e) {
    EXPECT_EQ(static_cast<int>(e.status()), static_cast<int>(status)) << e.what();
    const std::string msg = e.what();
    for (const std::string& s : substrings) {
      EXPECT_NE(msg.find(s), std::string::npos) << "message lacks \"" << s << "\":\n  " << msg;
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-luminav exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

// Expects `fn` to throw luminav::BundleError for `rule`, naming `field` (the dotted field, as
// Python's BundleError names it; "" : not checked), with a message holding every substring and
// ending with the rule's code.
template <typename Fn>
void expect_refusal(Fn&& fn, luminav::BundleRule rule, const std::string& field,
                    const std::vector<std::string>& substrings = {}) {
  try {
    fn();
  } catch (const luminav::BundleError& e) {
    EXPECT_STREQ(e.code(), luminav::bundle_rule_code(rule)) << e.what();
    if (!field.empty()) {
      EXPECT_EQ(e.field(), field) << e.what();
    }
    EXPECT_EQ(static_cast<int>(e.status()), static_cast<int>(luminav::Status::kBundleError));
    const std::string msg = e.what();
    const std::string tail = std::string(" [") + e.code() + "]";
    EXPECT_EQ(msg.substr(msg.size() >= tail.size() ? msg.size() - tail.size() : 0), tail) << msg;
    for (const std::string& s : substrings) {
      EXPECT_NE(msg.find(s), std::string::npos) << "message lacks \"" << s << "\":\n  " << msg;
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw something other than a BundleError: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

}  // namespace luminav_test

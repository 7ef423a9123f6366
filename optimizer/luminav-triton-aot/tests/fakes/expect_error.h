// tests/fakes/expect_error.h: expect_error, the assertion every test of a refusal uses: the
// luminav::Error thrown, its status, and the substrings its message must hold
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

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

}  // namespace luminav_test

// The environment settings layer (src/common/env.hpp): unset and empty give
// the default, listed values their position, anything else an error that
// names the variable, the value and what it accepts.
#include "common/env.hpp"

#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "support/test_support.hpp"

namespace dsmla::detail {
namespace {

constexpr const char* kName = "DSMLA_ENV_TEST_SETTING";

// Sets kName for one test and unsets it afterwards, whatever the outcome.
struct ScopedEnv {
  explicit ScopedEnv(const char* value) { EXPECT_EQ(setenv(kName, value, 1), 0); }
  ~ScopedEnv() { unsetenv(kName); }
};

TEST(EnvChoice, UnsetAndEmptyGiveTheDefault) {
  unsetenv(kName);
  EXPECT_EQ(env_choice(kName, {"0", "1"}), -1);
  ScopedEnv empty("");
  EXPECT_EQ(env_choice(kName, {"0", "1"}), -1);
}

TEST(EnvChoice, ListedValuesGiveTheirPosition) {
  {
    ScopedEnv env("whole");
    EXPECT_EQ(env_choice(kName, {"auto", "whole", "equal", "balanced"}), 1);
  }
  ScopedEnv env("2");
  EXPECT_EQ(env_choice(kName, {"0", "1", "2"}), 2);
}

TEST(EnvChoice, AnyOtherValueIsAnErrorNamingIt) {
  for (const char* bad : {"false", "01", " 1", "1 ", "balnced", "ON"}) {
    ScopedEnv env(bad);
    const std::string what = test::error_of([] { env_choice(kName, {"0", "1"}); });
    EXPECT_EQ(what, std::string(kName) + "='" + bad + "' (expected one of 0, 1, or unset)") << bad;
  }
}

TEST(EnvInteger, UnsetAndEmptyGiveNothing) {
  unsetenv(kName);
  EXPECT_FALSE(env_integer(kName, 1, 8).has_value());
  ScopedEnv empty("");
  EXPECT_FALSE(env_integer(kName, 1, 8).has_value());
}

TEST(EnvInteger, ValuesInRange) {
  for (const auto& [text, value] : {std::pair{"1", 1LL}, {"8", 8LL}, {"5", 5LL}}) {
    ScopedEnv env(text);
    EXPECT_EQ(env_integer(kName, 1, 8), value) << text;
  }
}

TEST(EnvInteger, MalformedOrOutOfRangeIsAnError) {
  for (const char* bad : {"0", "9", "-1", "3x", "x3", " 3", "3.0", "99999999999999999999999"}) {
    ScopedEnv env(bad);
    const std::string what = test::error_of([] { env_integer(kName, 1, 8); });
    EXPECT_EQ(what, std::string(kName) + "='" + bad + "' (expected an integer in [1, 8], or unset)") << bad;
  }
}

TEST(EnvInteger, AnOpenRangeReadsAsALowerBound) {
  ScopedEnv env("0");
  EXPECT_EQ(test::error_of([] { env_integer(kName, 1, INT_MAX); }),
            std::string(kName) + "='0' (expected an integer >= 1, or unset)");
}

}  // namespace
}  // namespace dsmla::detail

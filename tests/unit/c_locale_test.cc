// ScopedCLocale (base/c_locale.h): the C locale's numbers on this thread while alive, whatever the
// application set, and the previous locale back after; base/clock.h's messages use it.
#include "base/c_locale.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>

#include "base/clock.h"
#include "tests/common/comma_locale.h"

namespace concord {
namespace {

std::string Printed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

TEST(ScopedCLocaleTest, ThisThreadWritesTheCLocalesNumbersUntilItEnds) {
  const harness::CommaLocale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why();
  ASSERT_EQ(Printed(0.5), "0,50");  // the application's locale
  {
    const ScopedCLocale c_locale;
    EXPECT_EQ(Printed(0.5), "0.50");
    {
      const ScopedCLocale nested;
      EXPECT_EQ(Printed(0.5), "0.50");
    }
    EXPECT_EQ(Printed(0.5), "0.50");
    std::string elsewhere;
    std::thread([&elsewhere] { elsewhere = Printed(0.5); }).join();
    EXPECT_EQ(elsewhere, "0,50");  // other threads keep the application's locale
  }
  EXPECT_EQ(Printed(0.5), "0,50");
}

// Durations in messages read the same whatever the application's locale ("0,25 s" before).
TEST(ScopedCLocaleTest, FormatSecondsWritesADecimalPoint) {
  const harness::CommaLocale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why();
  EXPECT_EQ(FormatSeconds(0.25), "0.25 s");
  EXPECT_EQ(FormatSeconds(30), "30 s");
}

}  // namespace
}  // namespace concord

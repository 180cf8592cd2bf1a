// The coordinator's mismatch messages write a prescale or postscale as "1234.5" whatever locale
// the application made the global C++ one (de_DE's wrote "1.234,5").
#include <gtest/gtest.h>

#include <string>

#include "core/coordinator.h"
#include "tests/common/comma_locale.h"

namespace concord {
namespace {

TEST(CoordinatorLocaleTest, ScalesInAMismatchAreWrittenInTheCLocale) {
  const harness::CommaLocale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why();
  ResponseCache cache(64);
  Coordinator coordinator(2, &cache, StallOptions{});
  const Clock::time_point now = Clock::now();
  for (int rank = 0; rank < 2; ++rank) {
    RequestMessage m;
    TensorRequest r;
    r.name = "x";
    r.shape = {4};
    r.prescale = rank == 0 ? 1234.5 : 0.25;
    m.requests.push_back(r);
    const Status s = coordinator.Add(rank, m, now);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  StatusOr<ResponseMessage> taken = coordinator.TakeReady(now);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  ASSERT_EQ(taken->items.size(), 1u);
  const std::string& message = taken->items[0].response.error_message;
  EXPECT_NE(message.find("ranks disagree on prescale: 1234.5 on rank 0; 0.25 on rank 1"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace concord

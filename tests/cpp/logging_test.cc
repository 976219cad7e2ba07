// The budget that keeps gRPC's and protobuf's own log lines from flooding stderr (logging.h), on
// explicit times: no clock, no sleeps.
#include <gtest/gtest.h>

#include "server/logging.h"

namespace qvi {
namespace {

TEST(LineBudgetTest, ABurstThenTheRateAndTheNextLineSaysHowManyWereRefused) {
  LineBudget budget(/*burst=*/3, /*per_second=*/0.5);
  uint64_t refused = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(budget.Take(100.0, &refused)) << i;
    EXPECT_EQ(refused, 0u);
  }
  EXPECT_FALSE(budget.Take(100.0, &refused));
  EXPECT_FALSE(budget.Take(101.0, &refused)) << "half a line earned after one second";
  EXPECT_TRUE(budget.Take(102.0, &refused)) << "one line after two seconds";
  EXPECT_EQ(refused, 2u) << "the two refused since the last line written";
  EXPECT_FALSE(budget.Take(102.5, &refused));
  // A long quiet spell refills the burst, never more.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(budget.Take(10000.0, &refused)) << i;
  EXPECT_FALSE(budget.Take(10000.0, &refused));
}

TEST(LineBudgetTest, ATimeThatStepsBackEarnsNothing) {
  LineBudget budget(1, 1);
  uint64_t refused = 0;
  EXPECT_TRUE(budget.Take(50.0, &refused));
  EXPECT_FALSE(budget.Take(10.0, &refused));
  EXPECT_FALSE(budget.Take(50.5, &refused));
  EXPECT_TRUE(budget.Take(51.0, &refused));
  EXPECT_EQ(refused, 2u);
}

}  // namespace
}  // namespace qvi

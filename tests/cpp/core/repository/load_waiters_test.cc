// The requests waiting for a load on demand, alone (load_waiters.h).
#include "server/core/repository/load_waiters.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qvi {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

LoadWaiters::Waiter At(absl::Duration d, std::vector<std::string>* heard = nullptr, std::string who = "") {
  return {kT0 + d, [heard, who](absl::StatusOr<ServableHandle> loaded) {
            if (heard != nullptr) heard->push_back(who + (loaded.ok() ? ":ok" : ":" + loaded.status().ToString()));
          }};
}

TEST(LoadWaitersTest, OneLoadPerModelHoweverManyWaitAndEachModelGetsANewNumber) {
  LoadWaiters waiters;
  const uint64_t a = waiters.Add("a", At(absl::Seconds(5)));
  EXPECT_NE(a, 0u);
  EXPECT_EQ(waiters.Add("a", At(absl::Seconds(9))), 0u);  // joins a's load
  const uint64_t b = waiters.Add("b", At(absl::Seconds(5)));
  EXPECT_NE(b, 0u);
  EXPECT_NE(b, a);
  EXPECT_EQ(waiters.models(), 2u);
  EXPECT_EQ(waiters.LoadOf("a"), a);
  EXPECT_EQ(waiters.LoadOf("c"), 0u);
  EXPECT_EQ(waiters.Latest("a", kT0), kT0 + absl::Seconds(9));
  EXPECT_EQ(waiters.Latest("c", kT0), kT0);  // nobody waits: the floor
  EXPECT_TRUE(waiters.AnyAfter("a", kT0 + absl::Seconds(8)));
  EXPECT_FALSE(waiters.AnyAfter("a", kT0 + absl::Seconds(9)));
  EXPECT_EQ(waiters.Take("a").size(), 2u);
  EXPECT_FALSE(waiters.Waiting("a"));
  // A model waited for again after its waiters left gets a load of its own.
  const uint64_t again = waiters.Add("a", At(absl::Seconds(5)));
  EXPECT_NE(again, 0u);
  EXPECT_NE(again, a);
}

TEST(LoadWaitersTest, ExpiredWaitersLeaveAModelNobodyWaitsForLeavesAndTheNextDeadlineIsKept) {
  LoadWaiters waiters;
  std::vector<std::string> heard;
  waiters.Add("a", At(absl::Seconds(1), &heard, "a1"));
  waiters.Add("a", At(absl::Seconds(7), &heard, "a7"));
  waiters.Add("b", At(absl::Seconds(2), &heard, "b2"));
  absl::Time next = absl::InfiniteFuture();
  std::vector<LoadWaiters::Waiter> expired = waiters.Expire(kT0 + absl::Seconds(2), &next);
  ASSERT_EQ(expired.size(), 2u);
  for (LoadWaiters::Waiter& w : expired) w.ready(absl::DeadlineExceededError("late"));
  EXPECT_EQ(heard, std::vector<std::string>({"a1:DEADLINE_EXCEEDED: late", "b2:DEADLINE_EXCEEDED: late"}));
  EXPECT_EQ(next, kT0 + absl::Seconds(7));
  EXPECT_TRUE(waiters.Waiting("a"));
  EXPECT_FALSE(waiters.Waiting("b"));
  auto all = waiters.TakeAll();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all["a"].size(), 1u);
  EXPECT_EQ(waiters.models(), 0u);
}

}  // namespace
}  // namespace qvi

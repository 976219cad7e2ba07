// The memory budget's choices alone (memory_policy.h): charges, room for a load, idle models.
#include "server/core/repository/memory_policy.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qvi {
namespace {

using Verdict = RoomPlan::Verdict;

std::vector<std::string> Names(const RoomPlan& plan) {
  std::vector<std::string> names;
  for (const Evictable& m : plan.evict) names.push_back(m.name);
  return names;
}

TEST(MemoryLedgerTest, ChargesCountPerDeviceUntilReleasedAndLeavingIsWhatNoLongerServes) {
  MemoryLedger ledger;
  ledger.Charge(1, "cpu", 100);
  ledger.Charge(2, "cpu", 30);
  ledger.Charge(3, "cuda:0", 500);
  EXPECT_EQ(ledger.Used("cpu"), 130);
  EXPECT_EQ(ledger.Used("cuda:0"), 500);
  EXPECT_EQ(ledger.Charged(3), 500);
  EXPECT_EQ(ledger.Charged(9), 0);
  EXPECT_EQ(ledger.On(1, "cpu"), 100);
  EXPECT_EQ(ledger.On(1, "cuda:0"), 0);
  EXPECT_EQ(ledger.Leaving("cpu", {1}), 30);  // 2 no longer serves
  EXPECT_EQ(ledger.Leaving("cpu", {1, 2}), 0);
  ledger.Release(1);
  EXPECT_EQ(ledger.Used("cpu"), 30);
  EXPECT_EQ(ledger.Charged(1), 0);
}

TEST(PlanRoomTest, ALoadThatFitsOrCanNeverFitOrMayNotEvictIsDecidedBeforeAnyEviction) {
  const std::vector<Evictable> idle{{"a", 50, 1, false}};
  EXPECT_EQ(PlanRoom({100, 40, 0, 60, false, false}, idle).verdict, Verdict::kFits);
  EXPECT_EQ(PlanRoom({100, 40, 0, 101, true, false}, idle).verdict, Verdict::kMoreThanTheBudget);
  EXPECT_EQ(PlanRoom({100, 50, 0, 60, false, false}, idle).verdict, Verdict::kPollEvictsNothing);
  EXPECT_EQ(PlanRoom({100, 50, 0, 60, true, true}, idle).verdict, Verdict::kTimedOut);
  // Refusals unload nothing.
  EXPECT_TRUE(PlanRoom({100, 50, 0, 60, true, true}, idle).evict.empty());
  // When several hold, the first in this order is the answer: fits, never fits, may not evict, too late.
  EXPECT_EQ(PlanRoom({100, 40, 0, 60, false, true}, idle).verdict, Verdict::kFits);
  EXPECT_EQ(PlanRoom({100, 40, 0, 101, false, true}, idle).verdict, Verdict::kMoreThanTheBudget);
  EXPECT_EQ(PlanRoom({100, 50, 0, 60, false, true}, idle).verdict, Verdict::kPollEvictsNothing);
}

TEST(PlanRoomTest, IdleModelsGoBeforeBusyOnesLeastRecentlyUsedFirstAndOnlyAsManyAsMakeRoom) {
  const std::vector<Evictable> models{
      {"busy-old", 40, 1, true}, {"idle-new", 40, 9, false}, {"idle-old", 40, 5, false}, {"busy-new", 40, 7, true}};
  // 160 used of 200, 60 needed: short by 20, one model does.
  RoomPlan plan = PlanRoom({200, 160, 0, 60, true, false}, models);
  EXPECT_EQ(plan.verdict, Verdict::kEvict);
  EXPECT_EQ(Names(plan), std::vector<std::string>({"idle-old"}));
  // Short by 100: both idle ones, then the least recently used busy one.
  plan = PlanRoom({200, 160, 0, 140, true, false}, models);
  EXPECT_EQ(Names(plan), std::vector<std::string>({"idle-old", "idle-new", "busy-old"}));
}

TEST(PlanRoomTest, NothingIsUnloadedWhenUnloadingAllWouldNotDoOrWhatIsLeavingAlreadyMakesRoom) {
  // Short by 50 with 40 evictable: wait (a load under way may end and become evictable).
  RoomPlan plan = PlanRoom({100, 90, 0, 60, true, false}, {{"a", 40, 1, false}});
  EXPECT_EQ(plan.verdict, Verdict::kWait);
  EXPECT_TRUE(plan.evict.empty());
  // Short by 50, but 60 of what is used is unloading already: wait for it to drain.
  plan = PlanRoom({100, 90, 60, 60, true, false}, {{"a", 40, 1, false}});
  EXPECT_EQ(plan.verdict, Verdict::kWait);
  EXPECT_TRUE(plan.evict.empty());
  // Short by 50, 30 of it leaving: one more model makes the rest.
  plan = PlanRoom({100, 90, 30, 60, true, false}, {{"a", 40, 1, false}, {"b", 40, 2, false}});
  EXPECT_EQ(Names(plan), std::vector<std::string>({"a"}));
}

TEST(IdleModelsTest, AModelUnusedForTheWholeIntervalIsIdleAndTheNextDueTimeIsKept) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  const absl::Duration after = absl::Seconds(60);
  const std::vector<ModelUse> models{
      {"idle", true, false, now - absl::Seconds(61)},
      {"recent", true, false, now - absl::Seconds(20)},  // due in 40 s
      {"held", true, true, now - absl::Seconds(600)},    // a request holds it: never idle now
      {"not-ready", false, false, now - absl::Seconds(600)},
  };
  absl::Time next = absl::InfiniteFuture();
  EXPECT_EQ(IdleModels(models, after, now, &next), std::vector<std::string>({"idle"}));
  EXPECT_EQ(next, now + absl::Seconds(40));
  next = absl::InfiniteFuture();
  EXPECT_TRUE(IdleModels({}, after, now, &next).empty());
  EXPECT_EQ(next, now + after);  // a version READY from now on is due then at the earliest
}

}  // namespace
}  // namespace qvi

// The keeper thread alone (keeper.h): a pass at start, when its time comes, when poked; none after Stop().
#include "server/core/repository/keeper.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "tests/cpp/test_util/fake_env.h"

namespace qvi {
namespace {

// Until `passes` reaches `n`, or 30 s of real time (a broken keeper) have gone.
bool Reaches(const std::atomic<int>& passes, int n) {
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (passes.load() < n && absl::Now() < until) std::this_thread::yield();
  return passes.load() >= n;
}

TEST(KeeperTest, PassesAtStartWhenPokedEvenDuringAPassAndWhenItsTimeComesAndNotAfterStop) {
  FakeEnv env;
  std::atomic<int> passes{0};
  absl::Notification first_may_end;
  const absl::Time due = env.Now() + absl::Seconds(10);
  // Due at a fixed time, whenever a pass reads the clock; after the third, nothing more is due.
  Keeper keeper(&env, [&] {
    const int n = passes.fetch_add(1) + 1;
    if (n == 1) first_may_end.WaitForNotificationWithTimeout(absl::Seconds(30));
    return n < 3 ? due : absl::InfiniteFuture();
  });
  ASSERT_TRUE(Reaches(passes, 1));
  keeper.Poke();  // during the first pass: it may have looked before the poke, so another pass follows
  first_may_end.Notify();
  ASSERT_TRUE(Reaches(passes, 2));  // with no time passed
  env.Advance(absl::Seconds(10));
  ASSERT_TRUE(Reaches(passes, 3));
  keeper.Stop();
  EXPECT_EQ(passes.load(), 3);  // nothing was due after the third: no pass more before Stop()
  keeper.Stop();                // again: nothing to stop
}

}  // namespace
}  // namespace qvi

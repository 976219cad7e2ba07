// The executor under concurrent submitters: every accepted task runs exactly once, refusals are
// immediate, and Shutdown() drains what was accepted. Run under TSan and ASan by scripts/sanitize.sh.
#include "server/core/sched/executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "server/core/base/sync.h"

namespace qvi {
namespace {

TEST(ExecutorTest, AcceptedTasksRunExactlyOnceUnderConcurrency) {
  std::atomic<int> ran{0};
  std::atomic<int> accepted{0};
  {
    Executor executor(2, 64);
    std::vector<std::thread> submitters;
    for (int s = 0; s < 8; ++s) {
      submitters.emplace_back([&] {
        for (int i = 0; i < 200; ++i) {
          if (executor.TrySubmit([&] { ran.fetch_add(1); })) accepted.fetch_add(1);
        }
      });
    }
    for (auto& t : submitters) t.join();
    executor.Shutdown();
  }
  EXPECT_GT(accepted.load(), 0);
  EXPECT_EQ(ran.load(), accepted.load());
}

TEST(ExecutorTest, RefusesWhenFullAndAfterShutdown) {
  Executor executor(1, 1);
  Notification started, release;
  ASSERT_TRUE(executor.TrySubmit([&] {
    started.Notify();
    release.WaitForNotification();
  }));
  started.WaitForNotification();
  std::atomic<int> ran{0};
  EXPECT_TRUE(executor.TrySubmit([&] { ran++; }));
  EXPECT_FALSE(executor.TrySubmit([&] { ran++; }));
  release.Notify();
  executor.Shutdown();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(executor.TrySubmit([] {}));
}

}  // namespace
}  // namespace qvi

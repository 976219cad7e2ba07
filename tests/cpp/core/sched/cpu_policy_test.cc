// UseBatchScheduling(): the threads a process has and those it starts afterwards run under
// SCHED_BATCH. A binary of its own: it changes the policy of the whole test process.
#include "server/core/sched/cpu_policy.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <thread>

namespace qvi {
namespace {

int PolicyOfThisThread() { return sched_getscheduler(static_cast<pid_t>(syscall(SYS_gettid))); }

TEST(CpuPolicyTest, ThreadsRunningAndThreadsStartedLaterRunUnderSchedBatch) {
  ASSERT_EQ(PolicyOfThisThread(), SCHED_OTHER);
  std::atomic<int> earlier_policy{-1};
  std::atomic<bool> switched{false};
  std::atomic<pid_t> earlier_tid{0};
  std::thread earlier([&] {
    earlier_tid = static_cast<pid_t>(syscall(SYS_gettid));
    while (!switched) std::this_thread::yield();
    earlier_policy = PolicyOfThisThread();
  });
  while (earlier_tid == 0) std::this_thread::yield();
  EXPECT_EQ(sched_getscheduler(earlier_tid), SCHED_OTHER);

  ASSERT_TRUE(UseBatchScheduling().ok());
  switched = true;
  earlier.join();
  EXPECT_EQ(earlier_policy, SCHED_BATCH) << "a thread that was already running";
  EXPECT_EQ(PolicyOfThisThread(), SCHED_BATCH);
  int later_policy = -1;
  std::thread later([&] { later_policy = PolicyOfThisThread(); });
  later.join();
  EXPECT_EQ(later_policy, SCHED_BATCH) << "a thread started afterwards inherits it";
  EXPECT_TRUE(UseBatchScheduling().ok()) << "a second call changes nothing and succeeds";

  int http_like_policy = -1, its_child_policy = -1;
  std::thread back([&] {
    ASSERT_TRUE(UseDefaultSchedulingHere().ok());
    http_like_policy = PolicyOfThisThread();
    std::thread child([&] { its_child_policy = PolicyOfThisThread(); });
    child.join();
  });
  back.join();
  EXPECT_EQ(http_like_policy, SCHED_OTHER);
  EXPECT_EQ(its_child_policy, SCHED_OTHER);
  EXPECT_EQ(PolicyOfThisThread(), SCHED_BATCH) << "only the calling thread changed";
}

}  // namespace
}  // namespace qvi

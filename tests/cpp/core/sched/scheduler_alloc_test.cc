// The batch queue allocates nothing when it forms nothing: an instance thread that wakes to an
// empty queue, or to texts that are not due yet, costs no heap traffic under the queue's lock.
// Its own binary, because it counts every operator new of the process.
#include <gtest/gtest.h>

#include "server/core/sched/batch_scheduler.h"
#include "tests/cpp/test_util/count_allocations.h"
#include "tests/cpp/test_util/fake_env.h"

namespace qvi {
namespace {

using Scheduler = BatchScheduler<BatchRequest>;

TEST(SchedulerAllocationTest, ATakeBatchThatFormsNothingAllocatesNothing) {
  FakeEnv env;
  BatchSchedulerOptions o;
  o.max_batch_size = 4096;
  o.max_batch_tokens = 1 << 24;
  o.max_queue_delay = absl::Milliseconds(5);
  o.max_queued_texts = 4096;
  std::unique_ptr<Scheduler> s = *Scheduler::Create(o, &env);

  int64_t before = testing::Allocations();
  EXPECT_TRUE(s->TakeBatch().empty());  // an empty queue
  EXPECT_EQ(testing::Allocations() - before, 0);

  for (int i = 0; i < 1000; ++i) {
    auto r = std::make_shared<BatchRequest>(std::vector<int>{4 + i % 60}, absl::InfiniteFuture(), nullptr,
                                            [](absl::Status) {});
    ASSERT_TRUE(s->Enqueue(r).ok());
  }
  before = testing::Allocations();
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(s->TakeBatch().empty());  // 1000 texts, none due
  EXPECT_EQ(testing::Allocations() - before, 0);

  env.Advance(absl::Milliseconds(5));  // now the oldest is due: one batch of all of them
  EXPECT_EQ(s->TakeBatch().size(), 1000u);
  EXPECT_EQ(s->queued_texts(), 0u);
}

}  // namespace
}  // namespace qvi

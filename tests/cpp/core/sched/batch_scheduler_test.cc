// The batch scheduler, stepped by hand with a fake clock: no threads, no sleeps.
#include "server/core/sched/batch_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "tests/cpp/test_util/fake_env.h"

namespace qvi {
namespace {

// The scheduler on the base request type; the runner's tests cover it on RunnableRequest.
using Scheduler = BatchScheduler<BatchRequest>;
using Queued = QueuedText<BatchRequest>;

struct Probe {
  int calls = 0;
  absl::Status status;
};

std::shared_ptr<BatchRequest> Request(std::vector<int> lengths, Probe* probe,
                                      absl::Time deadline = absl::InfiniteFuture(), const bool* cancelled = nullptr) {
  return std::make_shared<BatchRequest>(
      std::move(lengths), deadline, [cancelled] { return cancelled != nullptr && *cancelled; },
      [probe](absl::Status s) {
        ++probe->calls;
        probe->status = s;
      });
}

std::vector<int> Lengths(const std::vector<Queued>& batch) {
  std::vector<int> out;
  for (const Queued& t : batch) out.push_back(t.tokens);
  return out;
}

class BatchSchedulerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Scheduler> Make(Scheduler::Options o) {
    auto s = Scheduler::Create(o, &env_);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  FakeEnv env_;
  Probe probe_;
};

TEST_F(BatchSchedulerTest, ClosesAtMaxBatchSizeWithoutWaiting) {
  auto s = Make({.max_batch_size = 3, .max_batch_tokens = 1000, .max_queue_delay = absl::Milliseconds(5)});
  ASSERT_TRUE(s->Enqueue(Request({4, 4}, &probe_)).ok());
  EXPECT_TRUE(s->TakeBatch().empty()) << "two texts, size 3, no time passed: not due";
  ASSERT_TRUE(s->Enqueue(Request({4, 4}, &probe_)).ok());
  EXPECT_EQ(s->TakeBatch().size(), 3u);
  EXPECT_EQ(s->queued_texts(), 1u);
}

TEST_F(BatchSchedulerTest, ClosesAtTheTokenBudget) {
  auto s = Make({.max_batch_size = 100, .max_batch_tokens = 40, .max_queue_delay = absl::Milliseconds(5)});
  ASSERT_TRUE(s->Enqueue(Request({10, 10, 10}, &probe_)).ok());
  EXPECT_TRUE(s->TakeBatch().empty()) << "30 of 40 padded tokens: not due";
  ASSERT_TRUE(s->Enqueue(Request({10, 12}, &probe_)).ok());
  EXPECT_EQ(Lengths(s->TakeBatch()), (std::vector<int>{10, 10, 10, 10}));  // 4 x 10 = 40; a 12 would pad to 60
  EXPECT_EQ(s->queued_texts(), 1u);
}

TEST_F(BatchSchedulerTest, ClosesAtTheMaxQueueDelayToTheMicrosecond) {
  auto s = Make({.max_batch_size = 8, .max_batch_tokens = 1000, .max_queue_delay = absl::Milliseconds(2)});
  ASSERT_TRUE(s->Enqueue(Request({5}, &probe_)).ok());
  EXPECT_EQ(s->NextDue(), env_.Now() + absl::Milliseconds(2));
  env_.Advance(absl::Microseconds(1999));
  EXPECT_TRUE(s->TakeBatch().empty());
  env_.Advance(absl::Microseconds(1));
  EXPECT_EQ(s->TakeBatch().size(), 1u);
  EXPECT_EQ(s->NextDue(), absl::InfiniteFuture());
}

TEST_F(BatchSchedulerTest, TakeNowHandsOutWhatWaitsWithoutTheDelayAndStillKeepsTheLimits) {
  auto s = Make({.max_batch_size = 2, .max_batch_tokens = 1000, .max_queue_delay = absl::Seconds(10)});
  ASSERT_TRUE(s->Enqueue(Request({5, 6, 7}, &probe_)).ok());
  EXPECT_EQ(Lengths(s->TakeBatch(Take::kNow)), (std::vector<int>{5, 6}));
  EXPECT_TRUE(s->TakeBatch(Take::kWhenDue).empty()) << "one text, no time passed: not due";
  EXPECT_EQ(Lengths(s->TakeBatch(Take::kNow)), (std::vector<int>{7}));
  EXPECT_TRUE(s->TakeBatch(Take::kNow).empty());
}

TEST_F(BatchSchedulerTest, GroupsTextsOfSimilarLength) {
  auto s = Make({.max_batch_size = 3, .max_batch_tokens = 1000, .max_queue_delay = absl::ZeroDuration()});
  ASSERT_TRUE(s->Enqueue(Request({10, 50, 11, 49, 12, 48}, &probe_)).ok());
  EXPECT_EQ(Lengths(s->TakeBatch()), (std::vector<int>{10, 11, 12}));
  EXPECT_EQ(Lengths(s->TakeBatch()), (std::vector<int>{50, 49, 48}));
}

TEST_F(BatchSchedulerTest, SplitsARequestAndAnswersOnceWhenAllPartsAreDone) {
  auto s = Make({.max_batch_size = 2, .max_batch_tokens = 1000, .max_queue_delay = absl::ZeroDuration()});
  ASSERT_TRUE(s->Enqueue(Request({3, 3, 3, 3, 3}, &probe_)).ok());
  std::vector<std::vector<Queued>> batches;
  while (true) {
    auto b = s->TakeBatch();
    if (b.empty()) break;
    batches.push_back(std::move(b));
  }
  ASSERT_EQ(batches.size(), 3u);
  std::vector<int> seen;
  for (auto& b : batches) {
    for (Queued& t : b) {
      seen.push_back(t.index);
      EXPECT_EQ(probe_.calls, 0);
      t.request->Complete(t.index, absl::OkStatus());
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(probe_.calls, 1);
  EXPECT_TRUE(probe_.status.ok());
}

TEST_F(BatchSchedulerTest, ExpiredRequestsNeverReachAModel) {
  auto s = Make({.max_batch_size = 4, .max_batch_tokens = 1000, .max_queue_delay = absl::Milliseconds(10)});
  Probe late, fine;
  ASSERT_TRUE(s->Enqueue(Request({5, 5}, &late, env_.Now() + absl::Milliseconds(3))).ok());
  ASSERT_TRUE(s->Enqueue(Request({5}, &fine)).ok());
  env_.Advance(absl::Milliseconds(4));
  EXPECT_TRUE(s->TakeBatch().empty());  // the expired request is dropped; the other is not due yet
  EXPECT_EQ(late.calls, 1);
  EXPECT_EQ(late.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s->queued_texts(), 1u);
  env_.Advance(absl::Milliseconds(6));
  auto batch = s->TakeBatch();
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(fine.calls, 0);
}

TEST_F(BatchSchedulerTest, CancelledRequestsAreDroppedAndAnsweredOnce) {
  auto s = Make({.max_batch_size = 2, .max_batch_tokens = 1000, .max_queue_delay = absl::ZeroDuration()});
  bool cancelled = false;
  ASSERT_TRUE(s->Enqueue(Request({5, 5, 5}, &probe_, absl::InfiniteFuture(), &cancelled)).ok());
  auto first = s->TakeBatch();  // two of its texts are already running
  ASSERT_EQ(first.size(), 2u);
  cancelled = true;
  EXPECT_TRUE(s->TakeBatch().empty());
  EXPECT_EQ(probe_.calls, 1);
  EXPECT_EQ(probe_.status.code(), absl::StatusCode::kCancelled);
  for (Queued& t : first) t.request->Complete(t.index, absl::OkStatus());  // late results are ignored
  EXPECT_EQ(probe_.calls, 1);
}

TEST_F(BatchSchedulerTest, FullQueueRefusesAtOnceAndChangesNothing) {
  auto s = Make({.max_batch_size = 4,
                 .max_batch_tokens = 1000,
                 .max_queue_delay = absl::Milliseconds(1),
                 .max_queued_texts = 3,
                 .max_queued_tokens = 100});
  ASSERT_TRUE(s->Enqueue(Request({5, 5}, &probe_)).ok());
  absl::Status refused = s->Enqueue(Request({5, 5}, &probe_));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s->Enqueue(Request({99}, &probe_)).code(), absl::StatusCode::kResourceExhausted);  // by tokens
  EXPECT_EQ(s->queued_texts(), 2u);
  EXPECT_EQ(probe_.calls, 0);
}

TEST_F(BatchSchedulerTest, AFailedPartFailsTheRequestOnce) {
  auto s = Make({.max_batch_size = 1, .max_batch_tokens = 1000, .max_queue_delay = absl::ZeroDuration()});
  ASSERT_TRUE(s->Enqueue(Request({3, 3}, &probe_)).ok());
  auto a = s->TakeBatch();
  auto b = s->TakeBatch();
  a[0].request->Complete(a[0].index, absl::InternalError("model failed"));
  b[0].request->Complete(b[0].index, absl::OkStatus());
  EXPECT_EQ(probe_.calls, 1);
  EXPECT_EQ(probe_.status.code(), absl::StatusCode::kInternal);
}

// A request whose texts span two batches can be finished by one (a model error) while the other is
// still queued. Once finished, the caller's context may be gone: the scheduler must not ask it.
TEST_F(BatchSchedulerTest, AFinishedRequestIsNotAskedWhetherItWasCancelled) {
  auto s = Make({.max_batch_size = 1, .max_batch_tokens = 1000, .max_queue_delay = absl::ZeroDuration()});
  int asked = 0;
  auto r = std::make_shared<BatchRequest>(
      std::vector<int>{3, 3}, absl::InfiniteFuture(), [&asked] { return ++asked, false; },
      [this](absl::Status st) { ++probe_.calls, probe_.status = st; });
  ASSERT_TRUE(s->Enqueue(r).ok());
  auto a = s->TakeBatch();
  ASSERT_EQ(a.size(), 1u);
  const int before = asked;
  EXPECT_GT(before, 0) << "a live request is asked when a batch forms";
  a[0].request->Complete(a[0].index, absl::InternalError("model failed"));
  EXPECT_FALSE(r->IsCancelled());
  EXPECT_TRUE(s->TakeBatch().empty()) << "the finished request's other text is dropped";
  EXPECT_EQ(asked, before);
  EXPECT_EQ(s->queued_texts(), 0u);
  EXPECT_EQ(probe_.calls, 1);
}

// The batch chosen as it was chosen before the scheduler stopped sorting the whole queue: every
// other text in a stable sort by distance from the seed's length, added while the limits allow.
std::vector<size_t> ReferenceBatch(const std::vector<int>& tokens, const BatchSchedulerOptions& o, bool& full) {
  full = false;
  std::vector<size_t> order;
  for (size_t i = 1; i < tokens.size(); ++i) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::abs(tokens[a] - tokens[0]) < std::abs(tokens[b] - tokens[0]);
  });
  std::vector<size_t> batch{0};
  int longest = std::max(tokens[0], 1);
  for (size_t i : order) {
    if (static_cast<int>(batch.size()) >= o.max_batch_size) break;
    const int len = std::max(longest, tokens[i]);
    if (static_cast<int64_t>(batch.size() + 1) * len > o.max_batch_tokens) {
      full = true;
      break;
    }
    longest = len;
    batch.push_back(i);
  }
  if (static_cast<int>(batch.size()) >= o.max_batch_size) full = true;
  if (static_cast<int64_t>(batch.size()) * longest >= o.max_batch_tokens) full = true;
  return batch;
}

// Random queues and limits: the batch is the reference's, and "is a batch due by a limit" decided
// before choosing (BatchWouldBeFull) agrees with the choice itself.
TEST(ChooseBatchTest, MatchesTheReferenceAndTheDueCheckAgreesWithIt) {
  std::mt19937 rng(11);
  std::vector<size_t> order, chosen;
  for (int round = 0; round < 5000; ++round) {
    BatchSchedulerOptions o;
    o.max_batch_size = std::uniform_int_distribution<int>(1, 40)(rng);
    o.max_batch_tokens = std::uniform_int_distribution<int>(1, 3000)(rng);
    const int n = std::uniform_int_distribution<int>(1, 60)(rng);
    const int max_len = std::uniform_int_distribution<int>(0, 120)(rng);
    std::vector<int> tokens;
    int longest = 0;
    for (int i = 0; i < n; ++i) {
      tokens.push_back(std::uniform_int_distribution<int>(0, max_len)(rng));
      longest = std::max(longest, tokens.back());
    }
    bool want_full = false, full = false;
    const std::vector<size_t> want = ReferenceBatch(tokens, o, want_full);
    ChooseBatch(tokens, o, order, chosen, full);
    ASSERT_EQ(chosen, want) << "round " << round;
    ASSERT_EQ(full, want_full) << "round " << round;
    ASSERT_EQ(BatchWouldBeFull(tokens.size(), longest, o), want_full) << "round " << round;
  }
}

TEST_F(BatchSchedulerTest, OptionsAreChecked) {
  EXPECT_EQ(Scheduler::Create({.max_batch_size = 0}, &env_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.max_batch_tokens = 0}, &env_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.max_queue_delay = absl::Milliseconds(-1)}, &env_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.max_queued_texts = 0}, &env_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.max_queued_tokens = 0}, &env_).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace qvi

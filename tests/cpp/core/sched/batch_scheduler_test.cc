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
// other text in a stable sort by level, then by distance from the seed's length, added while the
// limits allow.
std::vector<size_t> ReferenceBatch(const std::vector<int>& tokens, const std::vector<uint8_t>& levels, size_t seed,
                                   const BatchSchedulerOptions& o, bool& full) {
  full = false;
  std::vector<size_t> order;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i != seed) order.push_back(i);
  }
  const auto level = [&](size_t i) { return levels.empty() ? 2 : levels[i]; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (level(a) != level(b)) return level(a) < level(b);
    return std::abs(tokens[a] - tokens[seed]) < std::abs(tokens[b] - tokens[seed]);
  });
  std::vector<size_t> batch{seed};
  int longest = std::max(tokens[seed], 1);
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

// Random queues, levels, seeds and limits: the batch is the reference's, and "is a batch due by a
// limit" decided before choosing (BatchWouldBeFull) agrees with the choice itself.
TEST(ChooseBatchTest, MatchesTheReferenceAndTheDueCheckAgreesWithIt) {
  std::mt19937 rng(11);
  std::vector<size_t> order, chosen;
  for (int round = 0; round < 5000; ++round) {
    BatchSchedulerOptions o;
    o.max_batch_size = std::uniform_int_distribution<int>(1, 40)(rng);
    o.max_batch_tokens = std::uniform_int_distribution<int>(1, 3000)(rng);
    const int n = std::uniform_int_distribution<int>(1, 60)(rng);
    const int max_len = std::uniform_int_distribution<int>(0, 120)(rng);
    const bool leveled = round % 2 == 1;
    std::vector<int> tokens;
    std::vector<uint8_t> levels;
    int longest = 0;
    for (int i = 0; i < n; ++i) {
      tokens.push_back(std::uniform_int_distribution<int>(0, max_len)(rng));
      if (leveled) levels.push_back(static_cast<uint8_t>(std::uniform_int_distribution<int>(1, 3)(rng)));
      longest = std::max(longest, tokens.back());
    }
    const size_t seed = leveled ? std::uniform_int_distribution<size_t>(0, n - 1)(rng) : 0;
    bool want_full = false, full = false;
    const std::vector<size_t> want = ReferenceBatch(tokens, levels, seed, o, want_full);
    ChooseBatch(tokens, levels, seed, o, order, chosen, full);
    ASSERT_EQ(chosen, want) << "round " << round;
    ASSERT_EQ(full, want_full) << "round " << round;
    ASSERT_EQ(BatchWouldBeFull(tokens.size(), longest, o), want_full) << "round " << round;
  }
}

TEST(ChooseSeedTest, ALowerLevelCountsAsArrivingLaterByTheAgingPerLevel) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const absl::Duration aging = absl::Milliseconds(100);
  // A low text (put off by 200 ms) and a high one that came 150 ms after it: the high one first.
  EXPECT_EQ(ChooseSeed({t0, t0 + absl::Milliseconds(150)}, {3, 1}, aging), 1u);
  // ... one that came 250 ms after it: the low one first, it has waited long enough.
  EXPECT_EQ(ChooseSeed({t0, t0 + absl::Milliseconds(250)}, {3, 1}, aging), 0u);
  // Exactly the aging apart: the earlier in the queue.
  EXPECT_EQ(ChooseSeed({t0, t0 + absl::Milliseconds(100)}, {2, 1}, aging), 0u);
  // One level: the oldest; no aging: the oldest too.
  EXPECT_EQ(ChooseSeed({t0, t0 + absl::Milliseconds(1)}, {}, aging), 0u);
  EXPECT_EQ(ChooseSeed({t0, t0 + absl::Milliseconds(1)}, {3, 1}, absl::ZeroDuration()), 0u);
}

std::shared_ptr<BatchRequest> Prioritised(std::vector<int> lengths, Priority priority, Probe* probe) {
  std::shared_ptr<BatchRequest> r = Request(std::move(lengths), probe);
  r->set_priority(priority);
  return r;
}

TEST_F(BatchSchedulerTest, ABatchIsFilledFromTheHighestPriorityDown) {
  auto s = Make({.max_batch_size = 3, .max_batch_tokens = 1000, .max_queue_delay = absl::Milliseconds(5)});
  Probe low, normal, high;
  ASSERT_TRUE(s->Enqueue(Prioritised({10, 10, 10}, Priority::kLow, &low)).ok());
  ASSERT_TRUE(s->Enqueue(Prioritised({50}, Priority::kNormal, &normal)).ok());
  ASSERT_TRUE(s->Enqueue(Prioritised({90}, Priority::kHigh, &high)).ok());
  // The high text is the seed (the low ones came first, but count as 200 ms later); the normal one
  // comes before the lows, which are closer to nothing: lengths are compared within a level.
  auto batch = s->TakeBatch();
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(Lengths(batch), (std::vector<int>{10, 50, 90}));  // queue order
  EXPECT_EQ(s->queued_texts(), 2u);
}

TEST_F(BatchSchedulerTest, WithoutPrioritiesTheDefaultLevelKeepsTheArrivalOrder) {
  auto s = Make({.max_batch_size = 2, .max_batch_tokens = 1000, .max_queue_delay = absl::Milliseconds(5)});
  Probe a, b;
  ASSERT_TRUE(s->Enqueue(Prioritised({30}, Priority::kDefault, &a)).ok());
  env_.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(s->Enqueue(Prioritised({5, 30}, Priority::kNormal, &b)).ok());
  // Default and normal are one level: the oldest seeds, the closest in length joins it.
  EXPECT_EQ(Lengths(s->TakeBatch()), (std::vector<int>{30, 30}));
}

// A flood of low-priority texts keeps the queue full; one instance takes a batch every millisecond.
// High-priority texts, one every 20 ms, are queued in the place of low ones and each joins the very
// next batch: their wait stays within one batch interval however long the flood lasts. The low texts
// still get through (each batch has room), and the ones shed are answered with RESOURCE_EXHAUSTED.
TEST_F(BatchSchedulerTest, UnderAFloodOfLowPriorityTextsAHighPriorityTextsWaitStaysBounded) {
  auto s = Make({.max_batch_size = 8,
                 .max_batch_tokens = 100000,
                 .max_queue_delay = absl::Milliseconds(2),
                 .max_queued_texts = 256,
                 .priority_aging = absl::Milliseconds(100)});
  std::vector<std::unique_ptr<Probe>> probes;
  std::vector<std::pair<std::shared_ptr<BatchRequest>, absl::Time>> highs;
  std::mt19937 rng(7);
  absl::Duration worst_high = absl::ZeroDuration();
  int low_served = 0, low_refused = 0, low_shed_seen = 0;
  size_t shed_low = 0, shed_other = 0;
  for (int ms = 0; ms < 3000; ++ms) {
    Shed<BatchRequest> shed;
    for (int k = 0; k < 20; ++k) {  // 20 low texts a millisecond against 8 served
      probes.push_back(std::make_unique<Probe>());
      auto r = Prioritised({std::uniform_int_distribution<int>(1, 60)(rng)}, Priority::kLow, probes.back().get());
      if (!s->Enqueue(r).ok()) ++low_refused;
    }
    if (ms % 20 == 0) {
      probes.push_back(std::make_unique<Probe>());
      auto r = Prioritised({std::uniform_int_distribution<int>(1, 60)(rng)}, Priority::kHigh, probes.back().get());
      ASSERT_TRUE(s->Enqueue(r, &shed).ok()) << "a high-priority text takes a low one's place";
      highs.emplace_back(r, env_.Now());
    }
    shed_low += shed.texts[3];
    shed_other += shed.texts[1] + shed.texts[2];
    shed.Fail();
    for (const Queued& t : s->TakeBatch(Take::kNow)) {
      for (auto& [r, queued] : highs) {
        if (r == t.request) worst_high = std::max(worst_high, env_.Now() - queued);
      }
      if (t.level == 3) ++low_served;
      t.request->Complete(t.index, absl::OkStatus());
    }
    env_.Advance(absl::Milliseconds(1));
  }
  for (auto& [r, queued] : highs) EXPECT_TRUE(r->finished()) << "every high-priority text was served";
  EXPECT_EQ(worst_high, absl::ZeroDuration()) << "each joined the batch formed when it arrived";
  EXPECT_GT(low_served, 3000 * 6) << "the lows still had most of every batch";
  EXPECT_GT(low_refused, 0);
  // Once the queue is full (within the first 25 ms), each high text takes one low text's place.
  EXPECT_GE(shed_low, highs.size() - 2);
  EXPECT_LE(shed_low, highs.size());
  EXPECT_EQ(shed_other, 0u) << "nothing but low texts is shed";
  for (const auto& p : probes) {
    if (p->calls == 1 && p->status.code() == absl::StatusCode::kResourceExhausted) {
      ++low_shed_seen;
      EXPECT_NE(p->status.message().find("priority 3, low"), std::string::npos) << p->status;
    }
  }
  EXPECT_EQ(static_cast<size_t>(low_shed_seen), shed_low) << "each shed request was answered, once";
}

// The other way round: high-priority texts alone fill every batch, yet a low-priority text is served:
// once it has waited 2 x priority_aging it counts as older than the high texts arriving after that.
TEST_F(BatchSchedulerTest, UnderAFloodOfHighPriorityTextsALowPriorityTextWaitsAtMostTheAging) {
  auto s = Make({.max_batch_size = 4,
                 .max_batch_tokens = 100000,
                 .max_queue_delay = absl::Milliseconds(2),
                 .max_queued_texts = 64,
                 .priority_aging = absl::Milliseconds(50)});
  std::vector<std::unique_ptr<Probe>> probes;
  Probe low_probe;
  std::shared_ptr<BatchRequest> low;
  absl::Time low_queued;
  absl::Duration low_wait = absl::InfiniteDuration();
  for (int ms = 0; ms < 1000 && low_wait == absl::InfiniteDuration(); ++ms) {
    for (int k = 0; k < 4; ++k) {  // exactly what one batch a millisecond takes
      probes.push_back(std::make_unique<Probe>());
      (void)s->Enqueue(Prioritised({10}, Priority::kHigh, probes.back().get()));
    }
    if (ms == 100) {
      low = Prioritised({10}, Priority::kLow, &low_probe);
      ASSERT_TRUE(s->Enqueue(low).ok());
      low_queued = env_.Now();
    }
    for (const Queued& t : s->TakeBatch(Take::kNow)) {
      if (t.request == low) low_wait = env_.Now() - low_queued;
      t.request->Complete(t.index, absl::OkStatus());
    }
    env_.Advance(absl::Milliseconds(1));
  }
  ASSERT_NE(low_wait, absl::InfiniteDuration()) << "the low-priority text starved";
  EXPECT_GE(low_wait, absl::Milliseconds(99)) << "it waited while high-priority texts were queued ahead";
  EXPECT_LE(low_wait, absl::Milliseconds(101)) << "and no longer than the aging of its two levels";
}

TEST_F(BatchSchedulerTest, AFullQueueShedsTheLowestLevelNewestFirstAndWholeRequests) {
  auto s =
      Make({.max_batch_size = 8, .max_batch_tokens = 1000, .max_queue_delay = absl::Seconds(1), .max_queued_texts = 6});
  Probe low_old, low_new, normal, high, high2, normal2;
  ASSERT_TRUE(s->Enqueue(Prioritised({1, 1}, Priority::kLow, &low_old)).ok());
  ASSERT_TRUE(s->Enqueue(Prioritised({1, 1}, Priority::kNormal, &normal)).ok());
  ASSERT_TRUE(s->Enqueue(Prioritised({1, 1}, Priority::kLow, &low_new)).ok());
  // The queue is full: a normal (default) request takes a low request's place.
  EXPECT_EQ(s->Enqueue(Prioritised({1}, Priority::kDefault, &normal2)).code(), absl::StatusCode::kOk);
  EXPECT_EQ(low_new.calls, 1) << "the newest low request goes first, whole";
  EXPECT_EQ(low_new.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(low_old.calls, 0);
  EXPECT_EQ(s->queued_texts(), 5u);
  // A high request of 3 texts needs two more places: the other low request goes, the normal ones stay.
  Shed<BatchRequest> shed;
  ASSERT_TRUE(s->Enqueue(Prioritised({1, 1, 1}, Priority::kHigh, &high), &shed).ok());
  EXPECT_EQ(low_old.calls, 0) << "the holder of `shed` fails what was shed";
  shed.Fail();
  EXPECT_EQ(low_old.calls, 1);
  EXPECT_EQ(shed.texts[3], 2u);
  EXPECT_EQ(normal.calls, 0);
  EXPECT_EQ(s->queued_texts(), 6u);
  // Four more high texts would need all three normal ones' places and one more: refused, nothing shed.
  const absl::Status refused = s->Enqueue(Prioritised({1, 1, 1, 1}, Priority::kHigh, &high2));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("queue is full"), std::string::npos) << refused;
  EXPECT_EQ(normal.calls + normal2.calls, 0);
  EXPECT_EQ(s->queued_texts(), 6u);
  // One high text takes the newest normal request's place.
  Probe high3;
  ASSERT_TRUE(s->Enqueue(Prioritised({1}, Priority::kHigh, &high3)).ok());
  EXPECT_EQ(normal2.calls, 1);
  EXPECT_NE(normal2.status.message().find("priority 2, normal"), std::string::npos) << normal2.status;
  EXPECT_EQ(normal.calls, 0);
}

TEST_F(BatchSchedulerTest, ARequestTooLargeForTheWholeQueueShedsNothing) {
  auto s =
      Make({.max_batch_size = 8, .max_batch_tokens = 1000, .max_queue_delay = absl::Seconds(1), .max_queued_texts = 4});
  Probe low, high;
  ASSERT_TRUE(s->Enqueue(Prioritised({1, 1, 1}, Priority::kLow, &low)).ok());
  EXPECT_EQ(s->Enqueue(Prioritised({1, 1, 1, 1, 1}, Priority::kHigh, &high)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(low.calls, 0);
  EXPECT_EQ(s->queued_texts(), 3u);
}

TEST_F(BatchSchedulerTest, OptionsAreChecked) {
  EXPECT_EQ(Scheduler::Create({.max_batch_size = 0}, &env_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.max_batch_tokens = 0}, &env_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.max_queue_delay = absl::Milliseconds(-1)}, &env_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.max_queued_texts = 0}, &env_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.max_queued_tokens = 0}, &env_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.priority_aging = absl::Milliseconds(-1)}, &env_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace qvi

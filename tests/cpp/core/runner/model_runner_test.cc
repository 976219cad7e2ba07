// The model runner on fake time: a queue delay passes when the test advances the clock. Failure
// containment (issue 13): nothing is called out of the runner under its lock, and a done-callback,
// row handler or observer that throws fails only the texts it concerns while the instance thread
// goes on serving. Runs the fake model of tests/cpp/test_util/fake_model.h on the CPU.
#include "server/core/runner/model_runner.h"
#include "tests/cpp/test_util/fake_model.h"

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

#include <pthread.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "server/core/base/sync.h"
#include "server/core/sched/executor.h"
#include "tests/cpp/test_util/fake_env.h"

namespace qvi {
namespace {

class ThrowingObserver : public ServingObserver {
 public:
  std::atomic<int> batches_to_fail{0};
  std::atomic<int> depths_to_fail{0};
  void OnBatch(const std::string&, int64_t, const BatchReport&) override {
    if (batches_to_fail.fetch_sub(1) > 0) throw std::runtime_error("metrics backend is broken");
  }
  void OnQueueDepth(const std::string&, int64_t, size_t) override {
    if (depths_to_fail.fetch_sub(1) > 0) throw std::bad_alloc();
  }
};

// The calling thread's name (Env::StartThread names them: qvi-instance, qvi-answer).
std::string ThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

class CountingObserver : public ServingObserver {
 public:
  std::atomic<int> batches{0}, shares{0}, answered_texts{0};
  void OnBatch(const std::string&, int64_t, const BatchReport&) override { ++batches; }
  void OnQueueDepth(const std::string&, int64_t, size_t) override {}
  void OnAnswers(const std::string&, int64_t, const AnswerReport& a) override {
    ++shares;
    answered_texts += a.texts;
  }
};

class ModelRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = FakeModel::Create(); }

  void Start(ServingObserver* observer = nullptr, BatchingMode batching = BatchingMode::kWhenIdle,
             absl::Duration max_queue_delay = absl::ZeroDuration(), Executor* answers = nullptr, int instances = 1,
             int max_batch_size = 32) {
    BatchSchedulerOptions o;
    o.max_queue_delay = max_queue_delay;
    o.max_batch_size = max_batch_size;
    o.max_batch_tokens = 1 << 20;
    o.max_queued_texts = 1 << 20;
    o.max_queued_tokens = 1 << 24;
    runner_ = std::make_unique<ModelRunner>(model_, 1, *ModelRunner::Scheduler::Create(o, &env_), &env_, instances,
                                            observer, batching, answers, pipeline_);
  }

  // For a test whose runner uses the test's own locals (an observer, answer threads, what a fake
  // device waits on): made after them, it stops the runner before they go, also when an ASSERT
  // returns early. Otherwise an instance thread still reporting its last batch (OnAnswers comes
  // after the completions a test waits for) would reach an observer already destroyed.
  auto StopsBeforeTheLocals() {
    return absl::Cleanup([this] { runner_.reset(); });
  }

  // One text; `on_done` sees its status. `deadline` in the past makes it expire in the queue.
  static std::shared_ptr<RunnableRequest> Text(std::function<void(absl::Status)> on_done,
                                               absl::Time deadline = absl::InfiniteFuture()) {
    return std::make_shared<RunnableRequest>(
        std::vector<std::vector<int64_t>>{{2, 3, 4}}, OutputsOf({Output::kLogits}), deadline, nullptr,
        [](int, const ModelOutputs& out, int64_t) {
          return out.has(Output::kLogits) ? absl::OkStatus() : absl::InternalError("no logits");
        },
        std::move(on_done));
  }

  // Runs one text and returns its status (bounded: a runner that stopped serving fails the test).
  absl::Status RunOne() {
    auto result = std::make_shared<std::promise<absl::Status>>();
    std::future<absl::Status> f = result->get_future();
    absl::Status queued = runner_->Enqueue(Text([result](absl::Status s) { result->set_value(s); }));
    if (!queued.ok()) return queued;
    if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready)
      return absl::DeadlineExceededError("no answer");
    return f.get();
  }

  // Two one-text batches on a fake device (asynchronous or not) and a runner with its pipeline on or
  // off; `*answered_when_second_launched`: whether batch 1 had been answered when batch 2 was launched.
  void AnswerOrder(bool asynchronous, bool pipeline, int* answered_when_second_launched) {
    std::unique_ptr<FakeModel> fake = FakeModel::Create();
    Notification first_launched, second_queued;
    std::atomic<bool> first_answered{false};
    std::atomic<int> answered{-1};
    fake->set_device(
        [&](int launch) {
          if (launch == 1) {
            first_launched.Notify();
            second_queued.WaitForNotification();
          }
          if (launch == 2) answered = first_answered.load() ? 1 : 0;
        },
        asynchronous ? std::function<void(int)>([](int) {}) : nullptr);
    ASSERT_EQ(fake->asynchronous(), asynchronous);
    model_ = std::move(fake);
    pipeline_ = pipeline;
    Start(nullptr, BatchingMode::kWhenIdle, absl::ZeroDuration(), nullptr, 1, /*max_batch_size=*/1);
    auto stop = StopsBeforeTheLocals();
    Notification both;
    std::atomic<int> answers{0};
    auto count = [&](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      if (++answers == 2) both.Notify();
    };
    ASSERT_TRUE(runner_
                    ->Enqueue(Text([&](absl::Status s) {
                      first_answered = true;
                      count(s);
                    }))
                    .ok());
    ASSERT_TRUE(first_launched.WaitForNotificationWithTimeout(absl::Seconds(60)));
    ASSERT_TRUE(runner_->Enqueue(Text(count)).ok());
    second_queued.Notify();
    ASSERT_TRUE(both.WaitForNotificationWithTimeout(absl::Seconds(60)));
    runner_->Stop();
    *answered_when_second_launched = answered.load();
  }

  FakeEnv env_;
  bool pipeline_ = true;  // Start()'s runner pipelines batches (where the model is asynchronous)
  std::shared_ptr<const Model> model_;
  std::unique_ptr<ModelRunner> runner_;
};

TEST_F(ModelRunnerTest, ATextWaitsForTheQueueDelayOnTheEnvironmentsClock) {
  // An instance that does not batch when idle waits max_queue_delay for more texts. The clock is
  // fake: the instance thread sleeps until the test moves it past the text's due time.
  Start(nullptr, BatchingMode::kFillOrDelay, absl::Milliseconds(5));
  Notification done;
  absl::Status status = absl::UnknownError("not run");
  std::shared_ptr<RunnableRequest> text = Text([&](absl::Status s) {
    status = s;
    done.Notify();
  });
  ASSERT_TRUE(runner_->Enqueue(text).ok());
  env_.Advance(absl::Milliseconds(4));
  EXPECT_FALSE(done.HasBeenNotified()) << "ran before its queue delay passed";
  env_.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60))) << "the due text never ran";
  EXPECT_TRUE(status.ok()) << status;
  // Fake time moves only when the test moves it: the text waited exactly the delay, and the forward
  // pass took no time on this clock.
  EXPECT_EQ(text->timing().queue, absl::Milliseconds(5));
  EXPECT_EQ(text->timing().compute, absl::ZeroDuration());
}

TEST_F(ModelRunnerTest, DoneCallbacksRunWithoutTheRunnersLock) {
  Start();
  // An expired text is failed when the next batch forms. Its callback calls back into the runner
  // from another thread: were the runner's lock held, that Enqueue would wait until we return.
  std::promise<bool> entered_in_time;
  std::future<bool> verdict = entered_in_time.get_future();
  std::thread helper;
  Notification enqueued;
  ASSERT_TRUE(runner_
                  ->Enqueue(Text(
                      [&](absl::Status s) {
                        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
                        helper = std::thread([&] {
                          EXPECT_TRUE(runner_->Enqueue(Text([](absl::Status) {})).ok());
                          enqueued.Notify();
                        });
                        entered_in_time.set_value(enqueued.WaitForNotificationWithTimeout(absl::Seconds(10)));
                      },
                      env_.Now() - absl::Seconds(1)))
                  .ok());
  ASSERT_EQ(verdict.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(verdict.get()) << "a done-callback ran while the runner's lock was held";
  helper.join();
  EXPECT_TRUE(RunOne().ok());
}

TEST_F(ModelRunnerTest, AThrowingDoneCallbackEndsNeitherTheThreadNorOtherRequests) {
  Start();
  Notification thrown;
  ASSERT_TRUE(runner_
                  ->Enqueue(Text([&](absl::Status) {
                    thrown.Notify();
                    throw std::runtime_error("the front end's callback failed");
                  }))
                  .ok());
  ASSERT_TRUE(thrown.WaitForNotificationWithTimeout(absl::Seconds(60)));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(RunOne().ok()) << "the instance thread must still serve";
}

TEST_F(ModelRunnerTest, AThrowingObserverFailsThatBatchWithInternalAndNothingElse) {
  ThrowingObserver observer;
  observer.batches_to_fail = 1;
  Start(&observer);
  auto stop = StopsBeforeTheLocals();
  absl::Status failed = RunOne();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_NE(failed.message().find("OnBatch"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("metrics backend is broken"), std::string::npos) << failed;
  EXPECT_TRUE(RunOne().ok()) << "the next batch is unaffected";
  // The queue-depth gauge failing is logged and fails no request.
  observer.depths_to_fail = 100;
  EXPECT_TRUE(RunOne().ok());
}

TEST_F(ModelRunnerTest, AThrowingRowHandlerFailsOnlyItsText) {
  Start();
  auto bad = std::make_shared<std::promise<absl::Status>>();
  auto good = std::make_shared<std::promise<absl::Status>>();
  auto bad_f = bad->get_future();
  auto good_f = good->get_future();
  auto throwing = std::make_shared<RunnableRequest>(
      std::vector<std::vector<int64_t>>{{2, 3}}, OutputsOf({Output::kLogits}), absl::InfiniteFuture(), nullptr,
      [](int, const ModelOutputs&, int64_t) -> absl::Status { throw std::bad_alloc(); },
      [bad](absl::Status s) { bad->set_value(s); });
  ASSERT_TRUE(runner_->Enqueue(throwing).ok());
  ASSERT_TRUE(runner_->Enqueue(Text([good](absl::Status s) { good->set_value(s); })).ok());
  ASSERT_EQ(bad_f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  ASSERT_EQ(good_f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const absl::Status b = bad_f.get();
  EXPECT_EQ(b.code(), absl::StatusCode::kInternal) << b;
  EXPECT_TRUE(good_f.get().ok());
}

TEST_F(ModelRunnerTest, ABigBatchIsAnsweredInChunksOnTheAnswerThreads) {
  Executor answers(2, 0, &env_, "qvi-answer");
  CountingObserver observer;
  // The texts gather in the queue for the (fake) delay, then go as one batch of 40.
  Start(&observer, BatchingMode::kFillOrDelay, absl::Milliseconds(5), &answers, 1, 64);
  auto stop = StopsBeforeTheLocals();
  constexpr int kTexts = 40;
  Mutex mu;
  std::vector<std::string> threads;
  std::atomic<int> ok{0};
  Notification all_done;
  for (int i = 0; i < kTexts; ++i) {
    ASSERT_TRUE(runner_
                    ->Enqueue(Text([&](absl::Status s) {
                      ok += s.ok();
                      MutexLock lock(&mu);
                      threads.push_back(ThreadName());
                      if (threads.size() == kTexts) all_done.Notify();
                    }))
                    .ok());
  }
  env_.Advance(absl::Milliseconds(5));
  ASSERT_TRUE(all_done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  runner_->Stop();
  EXPECT_EQ(ok.load(), kTexts);
  EXPECT_EQ(observer.batches.load(), 1);
  // ceil(40 / 16) = 3 chunks by rows, at most one per answer thread: 2.
  EXPECT_EQ(observer.shares.load(), 2);
  EXPECT_EQ(observer.answered_texts.load(), kTexts);
  MutexLock lock(&mu);
  for (const std::string& t : threads) EXPECT_EQ(t, "qvi-answer") << "answered on the instance thread";
}

TEST_F(ModelRunnerTest, ALoneTextWithNothingQueuedIsAnsweredOnTheInstanceThread) {
  // A hand-off would only add a wake-up to its latency: the instance thread has nothing else to do.
  Executor answers(2, 0, &env_, "qvi-answer");
  Start(nullptr, BatchingMode::kWhenIdle, absl::ZeroDuration(), &answers);
  auto stop = StopsBeforeTheLocals();
  auto name = std::make_shared<std::promise<std::string>>();
  std::future<std::string> got = name->get_future();
  ASSERT_TRUE(runner_->Enqueue(Text([name](absl::Status) { name->set_value(ThreadName()); })).ok());
  ASSERT_EQ(got.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(got.get(), "qvi-instance");
}

// Requests of `texts` texts each, whose done-callbacks wait for `release`: they hold answer threads.
struct Held {
  Notification release;
  std::atomic<int> finished{0};
  std::shared_ptr<RunnableRequest> Request(int texts) {
    return std::make_shared<RunnableRequest>(
        std::vector<std::vector<int64_t>>(static_cast<size_t>(texts), std::vector<int64_t>{2, 3}),
        OutputsOf({Output::kLogits}), absl::InfiniteFuture(), nullptr,
        [](int, const ModelOutputs&, int64_t) { return absl::OkStatus(); },
        [this](absl::Status) {
          release.WaitForNotification();
          ++finished;
        });
  }
};

TEST_F(ModelRunnerTest, StopReturnsOnlyAfterTheAnswersOnThePoolAreMade) {
  Executor answers(2, 0, &env_, "qvi-answer");
  Start(nullptr, BatchingMode::kWhenIdle, absl::ZeroDuration(), &answers, 1, 20);
  auto stop = StopsBeforeTheLocals();
  Held held;
  // Each a batch of 20 texts (two chunks on the pool); two, so that the limit of batches being
  // answered does not hold the instance thread (and with it Stop) back.
  constexpr int kRequests = 2;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(runner_->Enqueue(held.Request(20)).ok());
  auto* fake = dynamic_cast<const FakeModel*>(model_.get());
  ASSERT_NE(fake, nullptr);
  for (int spins = 0; fake->runs_without_maps() < kRequests && spins < 60'000'000; ++spins) std::this_thread::yield();
  ASSERT_EQ(fake->runs_without_maps(), kRequests);
  std::atomic<int> finished_when_stopped{-1};
  std::promise<void> stopped;
  std::future<void> stopped_future = stopped.get_future();
  std::thread stopper([&] {
    runner_->Stop();
    finished_when_stopped = held.finished.load();
    stopped.set_value();
  });
  // Every batch has run its forward pass and the answers are held: a Stop that does not wait for
  // them returns now. Only a wait can show that it does not; a correct one never does, however long.
  EXPECT_EQ(stopped_future.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "Stop returned while answers were still being made";
  held.release.Notify();
  stopper.join();
  EXPECT_EQ(finished_when_stopped.load(), kRequests);
}

TEST_F(ModelRunnerTest, AtMostTwoBatchesPerInstanceAreBeingAnsweredAtOnce) {
  // Answers that cannot keep up hold the instance thread back instead of piling up batches.
  Executor answers(2, 0, &env_, "qvi-answer");
  Start(nullptr, BatchingMode::kWhenIdle, absl::ZeroDuration(), &answers, 1, 20);
  auto stop = StopsBeforeTheLocals();
  auto* fake = dynamic_cast<const FakeModel*>(model_.get());
  ASSERT_NE(fake, nullptr);
  Held held;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(runner_->Enqueue(held.Request(20)).ok());
  // Two batches are being answered (their callbacks held); the third ran its forward pass and waits.
  for (int spins = 0; fake->runs_without_maps() < 3 && spins < 60'000'000; ++spins) std::this_thread::yield();
  ASSERT_EQ(fake->runs_without_maps(), 3);
  // Only a wait can show that a fourth does not start; a correct runner never starts it, however long.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(fake->runs_without_maps(), 3);
  held.release.Notify();
  runner_->Stop();
  EXPECT_EQ(fake->runs_without_maps(), 6);
  EXPECT_EQ(held.finished.load(), 6);
}

class RunnerStressTest : public ModelRunnerTest {
 protected:
  // Two instances, three answer threads; a batch that holds a poisoned request fails (the fake
  // model throws), taking the other requests of its batch with it; some row handlers throw; some
  // requests expired before they came, some are cancelled while queued or while their batch is in
  // flight. Clients keep requests of 1-5 texts in flight without waiting for the answers, so
  // batches overlap on the pool. `on_device`: the fake computes on an emulated device after each
  // launch (up to 200 µs), so that each instance thread launches a batch before it collects the
  // last, and a batch holding kDeviceFails fails only when collected.
  void Stress(bool on_device) {
    constexpr int64_t kPoison = 4, kDeviceFails = 5;
    std::unique_ptr<FakeModel> fake = FakeModel::Create();
    fake->set_poison_id(kPoison);
    if (on_device) {
      fake->set_device(
          nullptr, [](int launch) { std::this_thread::sleep_for(std::chrono::microseconds((launch * 7919) % 200)); },
          kDeviceFails);
    }
    model_ = std::move(fake);
    Executor answers(3, 0, &env_, "qvi-answer");
    CountingObserver observer;
    Start(&observer, BatchingMode::kWhenIdle, absl::ZeroDuration(), &answers, 2, 32);
    auto stop = StopsBeforeTheLocals();
    constexpr int kClients = 8, kPerClient = 300;
    enum Kind { kNormal, kThrows, kExpired, kCancelled, kPoisoned, kFailsOnDevice };
    struct Outcome {
      Kind kind = kNormal;
      std::atomic<int> calls{0};
      absl::Status status = absl::UnknownError("unanswered");
    };
    std::vector<Outcome> outcomes(kClients * kPerClient);
    std::vector<std::thread> clients;
    std::atomic<int> wrong_rows{0};
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        std::mt19937 rng(static_cast<uint32_t>(c) * 7919u + 3u);
        for (int i = 0; i < kPerClient; ++i) {
          Outcome& out = outcomes[c * kPerClient + i];
          const int roll = std::uniform_int_distribution<int>(0, 99)(rng);
          out.kind = roll < 65                 ? kNormal
                     : roll < 75               ? kThrows
                     : roll < 85               ? kExpired
                     : roll < 95               ? kCancelled
                     : roll < 97 || !on_device ? kPoisoned
                                               : kFailsOnDevice;
          std::vector<std::vector<int64_t>> ids;
          const int n = std::uniform_int_distribution<int>(1, 5)(rng);
          for (int k = 0; k < n; ++k) {
            ids.push_back(std::vector<int64_t>(std::uniform_int_distribution<size_t>(1, 12)(rng),
                                               std::uniform_int_distribution<int64_t>(2, 3)(rng)));
          }
          if (out.kind == kPoisoned) ids.back().back() = kPoison;
          if (out.kind == kFailsOnDevice) ids.back().back() = kDeviceFails;
          auto cancelled = std::make_shared<std::atomic<bool>>(false);
          const Kind kind = out.kind;
          auto texts = std::make_shared<std::vector<std::vector<int64_t>>>(ids);
          auto request = std::make_shared<RunnableRequest>(
              std::move(ids), OutputsOf({Output::kLogits}),
              kind == kExpired ? env_.Now() - absl::Seconds(1) : absl::InfiniteFuture(),
              [cancelled] { return cancelled->load(); },
              [&wrong_rows, kind, texts](int index, const ModelOutputs& o, int64_t row) -> absl::Status {
                if (kind == kThrows && index == 0) throw std::runtime_error("row handler failed");
                // Each text gets its own row: logits = {sum of its ids, its length}.
                const std::vector<int64_t>& t = (*texts)[static_cast<size_t>(index)];
                int64_t sum = 0;
                for (int64_t id : t) sum += id;
                const at::Tensor l = o.at(Output::kLogits)[row];
                if (l[0].item<float>() != static_cast<float>(sum) || l[1].item<float>() != static_cast<float>(t.size()))
                  ++wrong_rows;
                return absl::OkStatus();
              },
              [&out](absl::Status s) {
                out.status = s;
                ++out.calls;
              });
          absl::Status queued = runner_->Enqueue(request);
          if (!queued.ok()) {
            out.status = queued;
            ++out.calls;
          }
          if (kind == kCancelled) cancelled->store(true);
        }
      });
    }
    for (std::thread& t : clients) t.join();
    runner_->Stop();  // every accepted text answered, on the pool or not, before it returns
    std::map<Kind, std::map<absl::StatusCode, int>> seen;
    for (const Outcome& out : outcomes) {
      ASSERT_EQ(out.calls.load(), 1) << "every request is answered exactly once";
      const absl::StatusCode code = out.status.code();
      seen[out.kind][code]++;
      switch (out.kind) {
        case kNormal:
          ASSERT_TRUE(code == absl::StatusCode::kOk || code == absl::StatusCode::kInternal) << out.status;
          break;
        case kThrows:
          ASSERT_EQ(code, absl::StatusCode::kInternal) << out.status;
          break;
        case kExpired:
          ASSERT_EQ(code, absl::StatusCode::kDeadlineExceeded) << out.status;
          break;
        case kCancelled:
          ASSERT_TRUE(code == absl::StatusCode::kOk || code == absl::StatusCode::kCancelled ||
                      code == absl::StatusCode::kInternal)
              << out.status;
          break;
        case kPoisoned:
        case kFailsOnDevice:
          // A request's texts may go in more than one batch, and a batch may hold both kinds:
          // either failure may be the one it hears of.
          ASSERT_EQ(code, absl::StatusCode::kInternal) << out.status;
          ASSERT_TRUE(out.status.message().find("a poisoned batch") != std::string::npos ||
                      (on_device && out.status.message().find("the device failed") != std::string::npos))
              << out.status;
          break;
      }
    }
    EXPECT_EQ(wrong_rows.load(), 0) << "a text was handed another text's row";
    EXPECT_GT(seen[kNormal][absl::StatusCode::kOk], 0);
    EXPECT_GT(seen[kNormal][absl::StatusCode::kInternal], 0) << "no clean request shared a batch with a poisoned one";
    EXPECT_GT(seen[kCancelled][absl::StatusCode::kCancelled], 0);
    EXPECT_GT(observer.shares.load(), observer.batches.load()) << "no batch was answered in chunks on the pool";
    if (on_device) EXPECT_GT(seen[kFailsOnDevice][absl::StatusCode::kInternal], 0);
  }
};

TEST_F(RunnerStressTest, EveryTextIsAnsweredOnceWhileBatchesFailExpireAndAreCancelledInThePipeline) {
  Stress(/*on_device=*/false);
}

// The same with batches launched before the last is collected, some failing on the device.
TEST_F(RunnerStressTest, EveryTextIsAnsweredOnceWhileBatchesFailOnTheDeviceAndAreCancelledInFlight) {
  Stress(/*on_device=*/true);
}

// Pipelining, where the device computes on its own: the instance thread launches batch 2 while
// batch 1 is still on the device, and answers batch 1 once the device is done with it.
TEST_F(ModelRunnerTest, OnAnAsynchronousDeviceTheNextBatchIsLaunchedBeforeTheLastIsCollected) {
  std::unique_ptr<FakeModel> fake = FakeModel::Create();
  Notification first_launched, second_queued, second_launched, first_computed;
  std::atomic<bool> first_answered{false};
  fake->set_device(
      [&](int launch) {
        if (launch == 1) {
          first_launched.Notify();
          second_queued.WaitForNotification();
        }
        if (launch == 2) second_launched.Notify();
      },
      [&](int launch) {
        if (launch == 1) first_computed.WaitForNotification();
      });
  model_ = std::move(fake);
  Start(nullptr, BatchingMode::kWhenIdle, absl::ZeroDuration(), nullptr, 1, /*max_batch_size=*/1);
  auto stop = StopsBeforeTheLocals();
  std::promise<absl::Status> first, second;
  ASSERT_TRUE(runner_
                  ->Enqueue(Text([&](absl::Status s) {
                    first_answered = true;
                    first.set_value(s);
                  }))
                  .ok());
  ASSERT_TRUE(first_launched.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(runner_->Enqueue(Text([&](absl::Status s) { second.set_value(s); })).ok());
  second_queued.Notify();
  // Batch 1 stays on the device until the test lets it finish: a runner that collected it before
  // launching batch 2 would wait here.
  const bool pipelined = second_launched.WaitForNotificationWithTimeout(absl::Seconds(20));
  EXPECT_TRUE(pipelined) << "batch 2 was not launched while batch 1 was on the device";
  EXPECT_FALSE(first_answered.load()) << "batch 1 was answered before the device was done with it";
  first_computed.Notify();
  auto f1 = first.get_future(), f2 = second.get_future();
  ASSERT_EQ(f1.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  ASSERT_EQ(f2.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(f1.get().ok());
  EXPECT_TRUE(f2.get().ok());
  runner_->Stop();
}

// On the CPU a launch computes the whole batch: it is answered before the next one is launched, so
// the pipeline adds no batch's time to any answer; so it is with the pipeline switched off
// (--pipeline-batches=false) on a device that computes on its own; with it on, batch 2 goes to the
// device before batch 1 is answered.
TEST_F(ModelRunnerTest, OnASynchronousDeviceEachBatchIsAnsweredBeforeTheNextIsLaunched) {
  int answered = -1;
  AnswerOrder(/*asynchronous=*/false, /*pipeline=*/true, &answered);
  EXPECT_EQ(answered, 1);
}

TEST_F(ModelRunnerTest, WithThePipelineOffEachBatchIsAnsweredBeforeTheNextIsLaunched) {
  int answered = -1;
  AnswerOrder(/*asynchronous=*/true, /*pipeline=*/false, &answered);
  EXPECT_EQ(answered, 1);
}

TEST_F(ModelRunnerTest, WithThePipelineOnTheNextBatchIsLaunchedBeforeTheLastIsAnswered) {
  int answered = -1;
  AnswerOrder(/*asynchronous=*/true, /*pipeline=*/true, &answered);
  EXPECT_EQ(answered, 0);
}

}  // namespace
}  // namespace qvi

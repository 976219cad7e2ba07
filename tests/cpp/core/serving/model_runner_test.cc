// The model runner on fake time: a queue delay passes when the test advances the clock. Failure
// containment (issue 13): nothing is called out of the runner under its lock, and a done-callback,
// row handler or observer that throws fails only the texts it concerns while the instance thread
// goes on serving. Runs the fake model of tests/cpp/test_util/fake_model.h on the CPU.
#include "server/core/serving/model_runner.h"
#include "tests/cpp/test_util/fake_model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <stdexcept>

#include "server/core/sched/sync.h"
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

class ModelRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = FakeModel::Create(); }

  void Start(ServingObserver* observer = nullptr, BatchingMode batching = BatchingMode::kWhenIdle,
             absl::Duration max_queue_delay = absl::ZeroDuration()) {
    BatchSchedulerOptions o;
    o.max_queue_delay = max_queue_delay;
    runner_ = std::make_unique<ModelRunner>(model_, 1, *ModelRunner::Scheduler::Create(o, &env_), &env_, 1, observer,
                                            batching);
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

  FakeEnv env_;
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

}  // namespace
}  // namespace qvi

// The model repository's lifecycle, driven by explicit Poll() calls (no polling thread, no
// sleeps): version policies, the atomic switch to a new version, unloading only after the last
// request, corrupt files isolated and retried when they change, removal, shutdown.
#include "server/core/repository/model_repository.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/core/base/sync.h"
#include "server/core/repository/memory_budget.h"
#include "server/core/sched/executor.h"
#include "server/core/serving/inference_service.h"
#include "tests/cpp/test_util/fake_env.h"
#include "tests/cpp/test_util/run.h"
#include "tests/cpp/test_util/store.h"

namespace qvi {
namespace {

namespace fs = std::filesystem;

// Every listener event, with a bounded wait for the ones other threads report (unloading).
class Events {
 public:
  void Add(const std::string& name, const VersionStatus& s) {
    MutexLock lock(&mu_);
    events_.push_back({name, s.version, s.state, s.reason});
    changed_.SignalAll();
  }
  int Count(const std::string& name, int64_t version, ModelState state) {
    MutexLock lock(&mu_);
    return CountLocked(name, version, state);
  }
  bool WaitFor(const std::string& name, int64_t version, ModelState state, absl::Duration within = absl::Seconds(60)) {
    const absl::Time until = absl::Now() + within;
    MutexLock lock(&mu_);
    while (CountLocked(name, version, state) == 0 && absl::Now() < until)
      changed_.WaitWithTimeout(&mu_, until - absl::Now());
    return CountLocked(name, version, state) > 0;
  }
  std::string Reason(const std::string& name, int64_t version, ModelState state) {
    MutexLock lock(&mu_);
    for (const Event& e : events_) {
      if (e.name == name && e.version == version && e.state == state) return e.reason;
    }
    return "";
  }

 private:
  struct Event {
    std::string name;
    int64_t version;
    ModelState state;
    std::string reason;
  };
  int CountLocked(const std::string& name, int64_t version, ModelState state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int n = 0;
    for (const Event& e : events_) n += e.name == name && e.version == version && e.state == state;
    return n;
  }
  Mutex mu_;
  CondVar changed_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

class ModelRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    demo_ = qvi::testing::DemoStore() / "sentiment" / "1" / "model.pt";
    ASSERT_TRUE(fs::exists(demo_)) << "run scripts/setup.sh first";
    store_ = std::make_unique<qvi::testing::TempStore>(std::string("repo_test_") +
                                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    root_ = store_->path();
    AddVersion(1);
  }
  void TearDown() override {
    repo_.reset();
    store_.reset();
  }

  // A version is staged under a name the scan ignores, then renamed into place, as docs/ advises.
  void AddVersion(int64_t v, const std::string& model = "sentiment") {
    const fs::path staging = root_ / model / ("." + std::to_string(v) + ".tmp");
    fs::create_directories(staging);
    fs::copy_file(demo_, staging / "model.pt");
    fs::rename(staging, root_ / model / std::to_string(v));
  }
  // Version 1 of another demo model (its manifest names it: a model must sit in its own folder).
  void AddDemoModel(const std::string& model) {
    const fs::path staging = root_ / model / ".1.tmp";
    fs::create_directories(staging);
    fs::copy_file(qvi::testing::DemoStore() / model / "1" / "model.pt", staging / "model.pt");
    fs::rename(staging, root_ / model / "1");
  }
  void WriteCorrupt(int64_t v) {
    fs::create_directories(root_ / "sentiment" / std::to_string(v));
    std::ofstream(root_ / "sentiment" / std::to_string(v) / "model.pt") << "not a TorchScript archive";
  }
  // Opens the repository on the fake environment and polls once (unless `poll` is false).
  void Open(const std::string& policy = "latest:1", std::function<void(ModelRepository::Options&)> adjust = nullptr,
            bool poll = true) {
    ModelRepository::Options o;
    o.root = root_.string();
    o.defaults.device = "cpu";
    o.version_policy = *VersionPolicy::Parse(policy);
    o.listener = [this](const std::string& name, const VersionStatus& s) { events_.Add(name, s); };
    o.env = &env_;
    if (adjust) adjust(o);
    auto repo = ModelRepository::Create(o);
    ASSERT_TRUE(repo.ok()) << repo.status();
    repo_ = std::move(*repo);
    if (poll) repo_->Poll();
  }
  // Versions and states as ListModels shows them, newest first.
  std::vector<std::pair<int64_t, ModelState>> States(const std::string& name = "sentiment") {
    std::vector<std::pair<int64_t, ModelState>> out;
    absl::StatusOr<ModelStatus> m = repo_->Get(name);
    if (!m.ok()) return out;
    for (const VersionStatus& v : m->versions) out.emplace_back(v.version, v.state);
    return out;
  }
  int64_t ServingVersion() {
    absl::StatusOr<ServableHandle> h = repo_->Resolve("sentiment", 0);
    return h.ok() ? (*h)->version : -1;
  }
  // Runs one text through the servable's own batch queue and returns the status it ends with.
  static absl::Status RunThrough(const ServableHandle& servable) {
    Notification done;
    absl::Status result;
    auto request = std::make_shared<RunnableRequest>(
        std::vector<std::vector<int64_t>>{{2, 3, 4}}, OutputsOf({Output::kLogits}), absl::InfiniteFuture(), nullptr,
        [](int, const ModelOutputs& out, int64_t) {
          return out.has(Output::kLogits) ? absl::OkStatus() : absl::InternalError("no logits");
        },
        [&](absl::Status s) {
          result = s;
          done.Notify();
        });
    absl::Status queued = servable->runner->Enqueue(request);
    if (!queued.ok()) return queued;
    done.WaitForNotification();
    return result;
  }

  std::unique_ptr<qvi::testing::TempStore> store_;
  fs::path demo_, root_;
  Events events_;
  FakeEnv env_;  // declared before repo_, so it outlives it
  std::unique_ptr<ModelRepository> repo_;
};

using S = ModelState;
using Versions = std::vector<std::pair<int64_t, ModelState>>;

TEST_F(ModelRepositoryTest, NewVersionSwitchesAtomicallyAndTheOldOneUnloadsAfterItsLastRequest) {
  Open();
  ASSERT_EQ(States(), (Versions{{1, S::kReady}}));
  absl::StatusOr<ServableHandle> old = repo_->Resolve("sentiment", 0);  // a request in flight on v1
  ASSERT_TRUE(old.ok()) << old.status();

  AddVersion(2);
  repo_->Poll();
  EXPECT_EQ(ServingVersion(), 2);  // every resolve from now on gets v2
  EXPECT_EQ(States(), (Versions{{2, S::kReady}, {1, S::kUnloading}}));
  EXPECT_EQ(events_.Reason("sentiment", 1, S::kUnloading), "replaced by version 2 (version policy latest:1)");
  absl::StatusOr<ServableHandle> pinned = repo_->Resolve("sentiment", 1);
  EXPECT_EQ(pinned.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(pinned.status().message().find("UNLOADING"), std::string::npos) << pinned.status();

  // v1 still answers the request that holds it, through its own batch queue.
  EXPECT_TRUE(RunThrough(*old).ok());
  EXPECT_EQ(events_.Count("sentiment", 1, S::kUnloaded), 0);
  old->reset();  // its last request is answered
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloaded));
  EXPECT_EQ(States(), (Versions{{2, S::kReady}}));
}

// An adapter that resolved a version (and planned the request against its manifest) gets its
// answer from that version, even when a newer one became ready in between: one resolution per
// request (inference_service.h, contract 2).
TEST_F(ModelRepositoryTest, ARequestIsAnsweredByTheVersionItWasResolvedTo) {
  Open();
  absl::StatusOr<ServableHandle> resolved = repo_->Resolve("sentiment", 0);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  AddVersion(2);
  repo_->Poll();
  ASSERT_EQ(ServingVersion(), 2);

  Executor executor(1, 4);
  InferenceService service(repo_.get(), &executor, RequestLimits{});
  InferenceRequest r;
  r.model = "sentiment";
  r.texts = {"A moving, funny film."};
  absl::StatusOr<InferenceResponse> pinned = testing::RunAndWait(service, Method::kClassify, r, *resolved);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(pinned->version, 1);
  absl::StatusOr<InferenceResponse> fresh = testing::RunAndWait(service, Method::kClassify, r);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->version, 2);

  // A handle for another model than the request names is the adapter's bug, said as such.
  r.model = "other";
  absl::StatusOr<InferenceResponse> mismatched = testing::RunAndWait(service, Method::kClassify, r, *resolved);
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInternal) << mismatched.status();
}

// A version a request holds is busy to the memory budget: the request lets go of it as its answer
// is handed over, not when the batch that ran it is freed later.
TEST_F(ModelRepositoryTest, ARequestLetsGoOfItsVersionAsItsAnswerIsHandedOver) {
  Open();
  const ServableHandle mine = *repo_->Resolve("sentiment", 0);  // the repository's hold, and this one
  Executor executor(1, 4);
  InferenceService service(repo_.get(), &executor, RequestLimits{});
  InferenceRequest r;
  r.model = "sentiment";
  r.texts = {"A moving, funny film.", "A dull one."};
  Notification answered;
  long holds_at_answer = -1;
  bool ok = false;
  service.Submit(Method::kClassify, r, [&](absl::StatusOr<InferenceResponse> answer) {
    // The thread that enqueued the request holds the version for the length of that call (the runner lives in
    // it), and an answer thread can answer before the call returns: give that hold a moment to go. The request's
    // own hold, were it kept until the answer is handed over, would not go while this callback runs.
    const absl::Time until = absl::Now() + absl::Seconds(5);
    while (mine.use_count() > 2 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
    ok = answer.ok();
    holds_at_answer = mine.use_count();
    answered.Notify();
  });
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_TRUE(ok);
  EXPECT_EQ(holds_at_answer, 2) << "the request still held its version when its answer was handed over";
}

TEST_F(ModelRepositoryTest, CorruptVersionFailsAloneAndIsRetriedOnlyWhenItsFileChanges) {
  Open();
  const ServableHandle before = *repo_->Resolve("sentiment", 0);
  WriteCorrupt(2);
  repo_->Poll();
  EXPECT_EQ(States(), (Versions{{2, S::kFailed}, {1, S::kReady}}));
  EXPECT_NE(repo_->Get("sentiment")->versions[0].reason.find("cannot read"), std::string::npos);
  EXPECT_EQ(repo_->Resolve("sentiment", 0)->get(), before.get()) << "the serving version must not change";
  EXPECT_EQ(repo_->Resolve("sentiment", 2).status().code(), absl::StatusCode::kUnavailable);

  repo_->Poll();  // unchanged file: not loaded again
  EXPECT_EQ(events_.Count("sentiment", 2, S::kLoading), 1);
  EXPECT_EQ(repo_->Resolve("sentiment", 0)->get(), before.get());

  // The copy completes (the file changes): v2 is tried again and takes over.
  fs::copy_file(demo_, root_ / "sentiment" / "2" / "model.pt", fs::copy_options::overwrite_existing);
  repo_->Poll();
  EXPECT_EQ(events_.Count("sentiment", 2, S::kLoading), 2);
  EXPECT_EQ(ServingVersion(), 2);
}

TEST_F(ModelRepositoryTest, ABadNewestVersionLeavesTheOlderServingUnderLatestOne) {
  WriteCorrupt(2);
  Open();
  EXPECT_EQ(States(), (Versions{{2, S::kFailed}, {1, S::kReady}}));
  EXPECT_EQ(ServingVersion(), 1);
}

TEST_F(ModelRepositoryTest, RemovingAVersionDrainsItFirst) {
  AddVersion(2);
  Open();
  ASSERT_EQ(States(), (Versions{{2, S::kReady}}));
  ServableHandle held = *repo_->Resolve("sentiment", 2);
  fs::remove_all(root_ / "sentiment" / "2");
  repo_->Poll();
  // v1 is loaded back (latest:1) before v2 leaves service, so version 0 never stops resolving.
  EXPECT_EQ(ServingVersion(), 1);
  EXPECT_EQ(States(), (Versions{{2, S::kUnloading}, {1, S::kReady}}));
  EXPECT_EQ(events_.Reason("sentiment", 2, S::kUnloading), "removed from the store");
  EXPECT_TRUE(RunThrough(held).ok()) << "a removed version finishes the work it holds";
  held.reset();
  ASSERT_TRUE(events_.WaitFor("sentiment", 2, S::kUnloaded));
  EXPECT_EQ(States(), (Versions{{1, S::kReady}}));

  fs::remove_all(root_ / "sentiment");  // the whole model
  repo_->Poll();
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloaded));
  EXPECT_EQ(repo_->Resolve("sentiment", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(repo_->List().empty());
}

TEST_F(ModelRepositoryTest, VersionPolicies) {
  AddVersion(2);
  AddVersion(3);
  Open("latest:2");
  EXPECT_EQ(States(), (Versions{{3, S::kReady}, {2, S::kReady}}));
  EXPECT_EQ(ServingVersion(), 3);
  EXPECT_EQ(repo_->Resolve("sentiment", 1).status().code(), absl::StatusCode::kNotFound);

  // serving.json overrides the server's policy for its model, read at the next poll.
  ServableHandle v2 = *repo_->Resolve("sentiment", 2);  // keeps v2 UNLOADING until released
  std::ofstream(root_ / "sentiment" / "serving.json") << R"({"version_policy": "specific:1,3"})";
  repo_->Poll();
  EXPECT_EQ(States(), (Versions{{3, S::kReady}, {2, S::kUnloading}, {1, S::kReady}}));
  EXPECT_EQ(events_.Reason("sentiment", 2, S::kUnloading), "not selected by the version policy specific:1,3");
  v2.reset();
  ASSERT_TRUE(events_.WaitFor("sentiment", 2, S::kUnloaded));
  EXPECT_EQ(repo_->Get("sentiment")->version_policy, "specific:1,3");

  std::ofstream(root_ / "sentiment" / "serving.json") << R"({"version_policy": "all"})";
  repo_->Poll();
  EXPECT_EQ(States(), (Versions{{3, S::kReady}, {2, S::kReady}, {1, S::kReady}}));
}

TEST_F(ModelRepositoryTest, ABadServingJsonFailsNewLoadsButKeepsWhatServes) {
  Open();
  std::ofstream(root_ / "sentiment" / "serving.json") << R"({"max_batch_szie": 4})";
  AddVersion(2);
  repo_->Poll();
  EXPECT_EQ(States(), (Versions{{2, S::kFailed}, {1, S::kReady}}));
  EXPECT_NE(repo_->Get("sentiment")->versions[0].reason.find("'max_batch_szie' is not a serving setting"),
            std::string::npos);
  std::ofstream(root_ / "sentiment" / "serving.json") << R"({"max_batch_size": 4})";  // fixed
  repo_->Poll();
  EXPECT_EQ(ServingVersion(), 2);
  EXPECT_EQ((*repo_->Resolve("sentiment", 0))->serving.max_batch_size, 4);
}

TEST_F(ModelRepositoryTest, OneModelsFailureLeavesTheOthersAlone) {
  Open();
  fs::create_directories(root_ / "broken" / "1");
  std::ofstream(root_ / "broken" / "1" / "model.pt") << "garbage";
  const ServableHandle before = *repo_->Resolve("sentiment", 0);
  repo_->Poll();
  EXPECT_EQ(States("broken"), (Versions{{1, S::kFailed}}));
  EXPECT_EQ(repo_->Resolve("broken", 0).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(repo_->Resolve("sentiment", 0)->get(), before.get());
  EXPECT_EQ(events_.Count("sentiment", 1, S::kLoading), 1);
}

// How long one text waits in the queue of a servable's batch queue.
// Queues one text, moves the fake clock by `advance`, and returns how long the text waited in the
// queue (on that clock: exactly as long as the test let time pass before it ran).
absl::Duration QueueWait(const ServableHandle& servable, FakeEnv& env, absl::Duration advance) {
  Notification done;
  auto request = std::make_shared<RunnableRequest>(
      std::vector<std::vector<int64_t>>{{2, 3}}, OutputsOf({Output::kLogits}), absl::InfiniteFuture(), nullptr,
      [](int, const ModelOutputs&, int64_t) { return absl::OkStatus(); }, [&](absl::Status) { done.Notify(); });
  EXPECT_TRUE(servable->runner->Enqueue(request).ok());
  if (advance > absl::ZeroDuration()) {
    EXPECT_FALSE(done.HasBeenNotified()) << "ran before the clock moved";
    env.Advance(advance);
  }
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60))) << "the text never ran";
  return request->timing().queue;
}

TEST_F(ModelRepositoryTest, AnIdleInstanceDoesNotWaitForTheQueueDelayUnlessToldTo) {
  // A minute of allowed delay: an idle instance still takes the lone text at once (the default).
  std::ofstream(root_ / "sentiment" / "serving.json") << R"({"max_queue_delay_ms": 60000})";
  Open();
  ServableHandle eager = *repo_->Resolve("sentiment", 0);
  EXPECT_EQ(eager->serving.batching, BatchingMode::kWhenIdle);
  EXPECT_EQ(QueueWait(eager, env_, absl::ZeroDuration()), absl::ZeroDuration());
  eager.reset();
  // Told to wait: the lone text waits the full delay for company.
  std::ofstream(root_ / "sentiment" / "serving.json") << R"({"max_queue_delay_ms": 50, "batch_when_idle": false})";
  AddVersion(2);
  repo_->Poll();
  ServableHandle patient = *repo_->Resolve("sentiment", 0);
  ASSERT_EQ(patient->version, 2);
  EXPECT_EQ(patient->serving.batching, BatchingMode::kFillOrDelay);
  EXPECT_EQ(QueueWait(patient, env_, absl::Milliseconds(50)), absl::Milliseconds(50));
}

TEST_F(ModelRepositoryTest, ShutdownWaitsForHeldVersionsThenRefuses) {
  Open();
  ServableHandle held = *repo_->Resolve("sentiment", 0);
  Notification finished;
  std::thread shutdown([&] {
    repo_->Shutdown();
    finished.Notify();
  });
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloading));
  EXPECT_EQ(repo_->Resolve("sentiment", 0).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(RunThrough(held).ok()) << "work held at shutdown is finished";
  EXPECT_FALSE(finished.HasBeenNotified());  // it cannot finish while `held` lives
  held.reset();
  shutdown.join();
  EXPECT_EQ(events_.Count("sentiment", 1, S::kUnloaded), 1);
}

TEST_F(ModelRepositoryTest, AStuckLoadIsAbandonedAndHoldsUpNoOtherModel) {
  // "stuck" never finishes loading until the test lets it go; "sentiment" loads normally.
  AddVersion(1, "stuck");
  auto release = std::make_shared<Notification>();
  auto stuck_started = std::make_shared<Notification>();
  auto stuck_finished = std::make_shared<Notification>();
  Open(
      "latest:1",
      [&](ModelRepository::Options& o) {
        o.load_timeout = absl::Minutes(10);  // of the fake clock: it passes when the test says
        o.load = [release, stuck_started, stuck_finished](const std::string& path, const LoadOptions& options) {
          if (path.find("/stuck") == std::string::npos) return Model::Load(path, options);
          stuck_started->Notify();
          release->WaitForNotification();  // a warm-up that hangs
          absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(path, options);
          stuck_finished->Notify();
          return model;
        };
      },
      /*poll=*/false);
  // The first poll loads both models at once; the clock moves past the timeout only once "sentiment"
  // is READY and "stuck" hangs, so exactly the stuck load is abandoned.
  std::thread first_poll([this] { repo_->Poll(); });
  ASSERT_TRUE(stuck_started->WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kReady));
  EXPECT_EQ(events_.Count("stuck", 1, S::kFailed), 0) << "abandoned before its timeout";
  env_.Advance(absl::Minutes(10));
  first_poll.join();
  EXPECT_EQ(States("sentiment"), (Versions{{1, S::kReady}}));
  EXPECT_EQ(States("stuck"), (Versions{{1, S::kFailed}}));
  EXPECT_NE(events_.Reason("stuck", 1, S::kFailed).find("did not finish within"), std::string::npos)
      << events_.Reason("stuck", 1, S::kFailed);
  absl::StatusOr<ServableHandle> sentiment = repo_->Resolve("sentiment", 0);
  ASSERT_TRUE(sentiment.ok()) << sentiment.status();
  EXPECT_TRUE(RunThrough(*sentiment).ok());
  // Rollouts of the other model go on while the abandoned load still hangs.
  AddVersion(2);
  repo_->Poll();
  EXPECT_EQ(ServingVersion(), 2);
  EXPECT_EQ(States("stuck"), (Versions{{1, S::kFailed}})) << "unchanged files: not retried";
  // The abandoned load finishing late changes nothing, and frees its model on its own thread.
  release->Notify();
  // Its thread must be done with torch before the test removes the files and the process exits.
  ASSERT_TRUE(stuck_finished->WaitForNotificationWithTimeout(absl::Seconds(60)));
  repo_->Poll();
  EXPECT_EQ(States("stuck"), (Versions{{1, S::kFailed}}));
}

// A load for the model "stuck" that hangs until the test lets it go; other models load normally.
struct StuckLoad {
  std::string folder = "/stuck";  // the loads that hang: of a path holding this
  std::shared_ptr<Notification> release = std::make_shared<Notification>();
  std::shared_ptr<Notification> started = std::make_shared<Notification>();
  std::shared_ptr<Notification> finished = std::make_shared<Notification>();
  std::function<absl::StatusOr<std::unique_ptr<Model>>(const std::string&, const LoadOptions&)> Load() const {
    return [folder = folder, release = release, started = started, finished = finished](const std::string& path,
                                                                                        const LoadOptions& options) {
      if (path.find(folder) == std::string::npos) return Model::Load(path, options);
      started->Notify();
      release->WaitForNotification();
      absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(path, options);
      finished->Notify();
      return model;
    };
  }
  // Lets the load go and waits until its thread is done with torch (before the files go).
  void Finish() const {
    release->Notify();
    ASSERT_TRUE(finished->WaitForNotificationWithTimeout(absl::Seconds(60)));
  }
};

TEST_F(ModelRepositoryTest, ShutdownAbandonsALoadThatNeverReturnsAndWaitsForNone) {
  AddVersion(1, "stuck");
  StuckLoad stuck;
  Open(
      "latest:1",
      [&](ModelRepository::Options& o) {
        o.load_timeout = absl::Minutes(10);  // of the fake clock, which does not move here
        o.load = stuck.Load();
      },
      /*poll=*/false);
  std::thread first_poll([this] { repo_->Poll(); });  // start-up's poll, waiting for both models
  ASSERT_TRUE(stuck.started->WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kReady));
  // Shutdown (a signal during start-up) returns although the load never does, and so does the poll.
  repo_->Shutdown();
  first_poll.join();
  EXPECT_EQ(events_.Count("stuck", 1, S::kReady), 0);
  EXPECT_NE(events_.Reason("stuck", 1, S::kFailed)
                .find("loading abandoned: the server is shutting down (it had run for 0 s)"),
            std::string::npos)
      << events_.Reason("stuck", 1, S::kFailed);
  EXPECT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloaded)) << "what had loaded is unloaded";
  EXPECT_EQ(repo_->LoadsStillRunning(), std::vector<std::string>{"stuck@1 (running for 0 s)"});
  repo_->Poll();  // after Shutdown: nothing happens
  EXPECT_EQ(events_.Count("stuck", 1, S::kLoading), 1);
  stuck.Finish();
  EXPECT_EQ(events_.Count("stuck", 1, S::kReady), 0) << "a load returning after shutdown is never served";
}

TEST_F(ModelRepositoryTest, TheBackgroundPollerGoesOnWithOtherModelsWhileALoadHangs) {
  AddVersion(1, "stuck");
  StuckLoad stuck;
  Open(
      "latest:1",
      [&](ModelRepository::Options& o) {
        o.load_timeout = absl::Minutes(10);
        o.load = stuck.Load();
      },
      /*poll=*/false);
  repo_->StartPolling(absl::Seconds(30));
  env_.Advance(absl::Seconds(30));
  ASSERT_TRUE(stuck.started->WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kReady));
  // The next polls pass over "stuck" (still loading) and roll out the other model's new version
  // long before the stuck load's timeout.
  AddVersion(2);
  // The poller sets its next due time after its last poll's dispatch, which may still be running
  // when the test moves the clock: moved on again until the poll comes (8 intervals, well inside the
  // stuck load's 10-minute timeout).
  bool rolled_out = false;
  for (int i = 0; i < 8 && !rolled_out; ++i) {
    env_.Advance(absl::Seconds(30));
    rolled_out = events_.WaitFor("sentiment", 2, S::kReady, i < 7 ? absl::Seconds(2) : absl::Seconds(60));
  }
  ASSERT_TRUE(rolled_out);
  EXPECT_EQ(ServingVersion(), 2);
  EXPECT_EQ(events_.Count("stuck", 1, S::kLoading), 1) << "a busy model is not polled twice at once";
  EXPECT_EQ(events_.Count("stuck", 1, S::kFailed), 0);
  stuck.Finish();
  // A slow load that returns in time is taken as it is: this one then fails on its manifest, which
  // names "sentiment" (the folder holds a copy of it), not on a timeout.
  ASSERT_TRUE(events_.WaitFor("stuck", 1, S::kFailed));
  EXPECT_NE(events_.Reason("stuck", 1, S::kFailed).find("manifest.json names the model 'sentiment'"), std::string::npos)
      << events_.Reason("stuck", 1, S::kFailed);
}

TEST_F(ModelRepositoryTest, FilesChangedUnderAReadyVersionAreLoadedAgainOrLeaveTheLoadedOnesServing) {
  Mutex mu;
  std::vector<std::string> changes;  // what files_changed heard, in order
  Open("latest:1", [&](ModelRepository::Options& o) {
    o.files_changed = [&](const std::string& name, int64_t version, const absl::Status& reload) {
      MutexLock lock(&mu);
      changes.push_back(absl::StrCat(name, "@", version, reload.ok() ? " reloaded" : " failed"));
    };
  });
  const auto heard = [&] {
    MutexLock lock(&mu);
    return changes;
  };
  // Overwritten in place (a new file renamed over the old: what `cp` to a temp name and `mv` do).
  const auto overwrite = [&](const std::string& content) {
    const fs::path file = root_ / "sentiment" / "1" / "model.pt";
    const fs::path tmp = root_ / "sentiment" / "1" / ".model.pt.tmp";
    if (content.empty()) {
      fs::copy_file(demo_, tmp);
    } else {
      std::ofstream(tmp) << content;
    }
    fs::rename(tmp, file);
  };
  ServableHandle before = *repo_->Resolve("sentiment", 0);
  repo_->Poll();
  EXPECT_TRUE(heard().empty()) << "unchanged files are not loaded again";

  overwrite("");
  repo_->Poll();
  EXPECT_EQ(heard(), std::vector<std::string>{"sentiment@1 reloaded"});
  ServableHandle after = *repo_->Resolve("sentiment", 0);
  EXPECT_NE(after.get(), before.get()) << "the new files serve under the same version";
  EXPECT_EQ(after->version, 1);
  EXPECT_TRUE(RunThrough(before).ok()) << "requests holding the replaced servable still finish";
  before.reset();

  overwrite("not a TorchScript archive");
  repo_->Poll();
  EXPECT_EQ(heard(), (std::vector<std::string>{"sentiment@1 reloaded", "sentiment@1 failed"}));
  EXPECT_EQ((*repo_->Resolve("sentiment", 0)).get(), after.get()) << "the loaded files keep serving";
  EXPECT_EQ(States(), (Versions{{1, S::kReady}}));
  EXPECT_NE(repo_->Get("sentiment")->versions[0].reason.find("model files changed and did not load"),
            std::string::npos);
  repo_->Poll();
  EXPECT_EQ(heard().size(), 2u) << "files that failed are not tried again until they change";

  overwrite("");
  repo_->Poll();
  EXPECT_EQ(heard().back(), "sentiment@1 reloaded");
  EXPECT_NE((*repo_->Resolve("sentiment", 0)).get(), after.get());
  EXPECT_EQ(repo_->Get("sentiment")->versions[0].reason, "");
}

TEST_F(ModelRepositoryTest, PollingFollowsTheEnvironmentsClock) {
  Open();
  repo_->StartPolling(absl::Seconds(30));
  AddVersion(2);
  env_.Advance(absl::Seconds(29));
  EXPECT_EQ(events_.Count("sentiment", 2, S::kLoading), 0) << "polled before the interval passed";
  env_.Advance(absl::Seconds(1));
  ASSERT_TRUE(events_.WaitFor("sentiment", 2, S::kReady)) << "no poll once the interval passed";
  EXPECT_EQ(ServingVersion(), 2);
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloaded));
}

namespace control {

// One control request's answer: `done` for RequestLoad/RequestUnload, and a bounded wait for it.
struct Answer {
  std::shared_ptr<Notification> arrived = std::make_shared<Notification>();
  std::shared_ptr<int> calls = std::make_shared<int>(0);
  std::shared_ptr<absl::Status> status = std::make_shared<absl::Status>();
  ModelRepository::ControlDone done() const {
    return [arrived = arrived, calls = calls, status = status](const absl::Status& s) {
      ++*calls;
      *status = s;
      arrived->Notify();
    };
  }
  // For WhenLoaded: the version handed over is kept (`loaded`), and its model's name as the status's message.
  ModelRepository::LoadedDone loaded_done() const {
    return [arrived = arrived, calls = calls, status = status, held = held](absl::StatusOr<ServableHandle> s) {
      ++*calls;
      *status = s.ok() ? absl::OkStatus() : s.status();
      if (s.ok()) *held = *s;
      arrived->Notify();
    };
  }
  absl::Status Wait() const {
    EXPECT_TRUE(arrived->WaitForNotificationWithTimeout(absl::Seconds(120)));
    return *status;
  }
  bool Arrived() const { return arrived->HasBeenNotified(); }
  std::shared_ptr<ServableHandle> held = std::make_shared<ServableHandle>();
};

void Explicit(ModelRepository::Options& o, std::vector<std::string> at_start) {
  o.model_control = ModelControl::kExplicit;
  o.load_at_start = std::move(at_start);
}

}  // namespace control

TEST_F(ModelRepositoryTest, ExplicitModelControlServesWhatIsLoadedAndUnloadDrainsFirst) {
  AddDemoModel("topics");
  Open("latest:1", [](ModelRepository::Options& o) { control::Explicit(o, {"sentiment"}); });
  EXPECT_EQ(States("sentiment"), (Versions{{1, S::kReady}}));
  EXPECT_TRUE(States("topics").empty()) << "in the store, not loaded";
  const absl::Status not_loaded = repo_->Resolve("topics", 0).status();
  EXPECT_EQ(not_loaded.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(not_loaded.message(),
            "model 'topics' is not loaded: the server's model control is explicit, and an admin loads it (OIP "
            "RepositoryModelLoad, POST /v2/repository/models/topics/load)");
  std::vector<ModelStatus> index = repo_->Index();
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[0].name, "sentiment");
  EXPECT_EQ(index[0].versions.size(), 1u);
  EXPECT_EQ(index[1].name, "topics");
  EXPECT_TRUE(index[1].versions.empty());

  control::Answer load;
  repo_->RequestLoad("topics", load.done());
  ASSERT_TRUE(load.Wait().ok()) << *load.status;
  EXPECT_EQ(States("topics"), (Versions{{1, S::kReady}}));
  ServableHandle held = *repo_->Resolve("topics", 0);  // a request in flight when the unload comes

  control::Answer unload;
  repo_->RequestUnload("topics", unload.done());
  ASSERT_TRUE(unload.Wait().ok()) << *unload.status;
  const absl::Status unloading = repo_->Resolve("topics", 0).status();
  EXPECT_EQ(unloading.code(), absl::StatusCode::kUnavailable);
  // What happened, not "removed from the store": the folder is still there.
  EXPECT_EQ(events_.Reason("topics", 1, S::kUnloading), "unloaded by an admin request");
  EXPECT_NE(unloading.message().find("unloaded by an admin request"), std::string::npos) << unloading;
  EXPECT_TRUE(RunThrough(held).ok()) << "the version it was resolved to answers it";
  EXPECT_EQ(events_.Count("topics", 1, S::kUnloaded), 0);
  held.reset();
  ASSERT_TRUE(events_.WaitFor("topics", 1, S::kUnloaded));
  repo_->Poll();
  EXPECT_TRUE(States("topics").empty()) << "a poll does not bring back what was unloaded";
  EXPECT_EQ(*load.calls + *unload.calls, 2) << "each answered once";
}

TEST_F(ModelRepositoryTest, ModelControlRefusalsNameWhatIsWrong) {
  Open();  // poll mode
  control::Answer poll;
  repo_->RequestLoad("sentiment", poll.done());
  EXPECT_EQ(poll.Wait().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(poll.status->message().find("start it with --model-control explicit"), std::string::npos) << *poll.status;

  repo_.reset();
  Open("latest:1", [](ModelRepository::Options& o) { control::Explicit(o, {}); });
  EXPECT_TRUE(repo_->List().empty()) << "explicit, nothing named at start: nothing loads";
  control::Answer unknown, gone;
  repo_->RequestLoad("nope", unknown.done());
  EXPECT_EQ(unknown.Wait().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.status->message(),
            absl::StrCat("model 'nope' is not in the model store ", root_.string(), "; the store holds: sentiment"));
  repo_->RequestUnload("nope", gone.done());
  EXPECT_EQ(gone.Wait().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status->message().find("is not in the model store"), std::string::npos);

  ModelRepository::Options o;
  o.root = root_.string();
  o.defaults.device = "cpu";
  o.env = &env_;
  control::Explicit(o, {"nope"});
  absl::StatusOr<std::unique_ptr<ModelRepository>> bad = ModelRepository::Create(o);
  EXPECT_EQ(bad.status().message(), absl::StrCat("--load-model 'nope': the model store ", root_.string(),
                                                 " has no such model; it holds: sentiment"));
  o.model_control = ModelControl::kPoll;
  EXPECT_EQ(ModelRepository::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelRepositoryTest, ALoadThatFailsSaysWhyAndTheStarLoadsEveryModel) {
  WriteCorrupt(2);
  AddDemoModel("topics");
  Open("latest:1", [](ModelRepository::Options& o) { control::Explicit(o, {"*"}); });
  // latest:1 fell back to version 1 of sentiment when 2 failed; both models loaded.
  EXPECT_EQ(States("topics"), (Versions{{1, S::kReady}}));
  EXPECT_EQ(ServingVersion(), 1);
  fs::remove_all(root_ / "sentiment" / "1");
  control::Answer reload;
  repo_->RequestLoad("sentiment", reload.done());  // applies the store's change: only the corrupt one is left
  EXPECT_EQ(reload.Wait().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(reload.status->message().rfind("model 'sentiment' did not load: ", 0), 0u) << *reload.status;
  EXPECT_NE(reload.status->message().find("version 2 FAILED: cannot read "), std::string::npos) << *reload.status;
}

TEST_F(ModelRepositoryTest, ALoadRacingAnUnloadIsAnsweredOnceEachAndTheLastOneWins) {
  AddDemoModel("topics");
  StuckLoad stuck{"/topics"};
  Open("latest:1", [&](ModelRepository::Options& o) {
    control::Explicit(o, {});
    o.load = stuck.Load();
  });
  control::Answer load, unload, again;
  repo_->RequestLoad("topics", load.done());
  ASSERT_TRUE(stuck.started->WaitForNotificationWithTimeout(absl::Seconds(60)));
  repo_->RequestUnload("topics", unload.done());  // while the load runs: after it, a poll of its own
  repo_->RequestLoad("topics", again.done());     // ... and this one rides with it
  EXPECT_FALSE(load.arrived->HasBeenNotified());
  stuck.Finish();
  EXPECT_TRUE(load.Wait().ok()) << *load.status;  // READY when its poll ended
  EXPECT_TRUE(unload.Wait().ok()) << *unload.status;
  EXPECT_TRUE(again.Wait().ok()) << *again.status << " (the last request was a load)";
  EXPECT_EQ(States("topics"), (Versions{{1, S::kReady}}));
  EXPECT_EQ(*load.calls + *unload.calls + *again.calls, 3);
}

TEST_F(ModelRepositoryTest, ShutdownAnswersTheControlsItCutShort) {
  AddDemoModel("topics");
  StuckLoad stuck{"/topics"};
  Open("latest:1", [&](ModelRepository::Options& o) {
    control::Explicit(o, {});
    o.load = stuck.Load();
  });
  control::Answer load, waiting;
  repo_->RequestLoad("topics", load.done());
  ASSERT_TRUE(stuck.started->WaitForNotificationWithTimeout(absl::Seconds(60)));
  repo_->RequestUnload("topics", waiting.done());
  repo_->Shutdown();
  EXPECT_EQ(load.Wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(waiting.Wait().code(), absl::StatusCode::kUnavailable);
  control::Answer late;
  repo_->RequestLoad("topics", late.done());
  EXPECT_EQ(late.Wait().message(), "the server is shutting down");
  stuck.Finish();
}

namespace budget {

constexpr int64_t kMiB = int64_t{1} << 20;

// A device of 1 GiB whose memory in use grows by 40 MiB with each load (Budget's loader adds it).
class FakeMeter final : public MemoryMeter {
 public:
  int64_t InUse(const c10::Device&) const override { return in_use.load(); }
  int64_t Capacity(const c10::Device&) const override { return 1024 * kMiB; }
  std::atomic<int64_t> in_use{0};
};

void Budget(ModelRepository::Options& o, FakeMeter* meter, int64_t bytes) {
  o.memory_budget.bytes = bytes;
  o.meter = meter;
  o.load = [meter](const std::string& path, const LoadOptions& options) {
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(path, options);
    meter->in_use += 40 * kMiB;
    return model;
  };
}

// Options::memory_event's reports, "name loaded poll" or "name unloaded budget".
class MemoryEvents {
 public:
  std::function<void(const std::string&, bool, const char*)> Record() {
    return [this](const std::string& name, bool loaded, const char* reason) {
      MutexLock lock(&mu_);
      seen_.push_back(absl::StrCat(name, loaded ? " loaded " : " unloaded ", reason));
    };
  }
  std::vector<std::string> Seen() {
    MutexLock lock(&mu_);
    return seen_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace budget

using budget::kMiB;

TEST(MemoryBudgetTest, BytesFractionsAndPercentagesParseAndNonsenseIsRefusedByName) {
  EXPECT_FALSE(ParseMemoryBudget("")->enabled());
  EXPECT_FALSE(ParseMemoryBudget("0")->enabled());
  EXPECT_EQ(ParseMemoryBudget("24GiB")->bytes, 24 * 1024 * kMiB);
  EXPECT_EQ(ParseMemoryBudget("512 MB")->bytes, 512'000'000);
  EXPECT_EQ(ParseMemoryBudget("1073741824")->bytes, 1024 * kMiB);
  EXPECT_DOUBLE_EQ(ParseMemoryBudget("0.8")->fraction, 0.8);
  EXPECT_DOUBLE_EQ(ParseMemoryBudget("80%")->fraction, 0.8);
  EXPECT_EQ(ParseMemoryBudget("80%")->On(1000), 800);
  EXPECT_EQ(ParseMemoryBudget("2GiB")->On(1000), 2048 * kMiB) << "bytes do not depend on the device";
  for (const char* bad : {"-1", "lots", "150%", "12XB", "100"}) {
    absl::StatusOr<MemoryBudget> b = ParseMemoryBudget(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().message().rfind(absl::StrCat("--device-memory-budget '", bad, "': "), 0), 0u) << b.status();
  }
  EXPECT_EQ(FormatBytes(40 * kMiB), "40.0 MiB");
  EXPECT_EQ(FormatBytes(512), "512 B");
}

TEST_F(ModelRepositoryTest, FootprintsAreMeasuredAtLoadOrTakenFromServingJson) {
  AddDemoModel("topics");
  std::ofstream(root_ / "topics" / "serving.json") << R"({"memory_bytes": 123456789})";
  Open();  // no budget: the process's own meter
  EXPECT_GT(repo_->Get("sentiment")->versions.at(0).memory_bytes, 0) << "its weights at least";
  EXPECT_EQ(repo_->Get("topics")->versions.at(0).memory_bytes, 123456789);
}

TEST_F(ModelRepositoryTest, AnAskedLoadOverTheBudgetUnloadsTheLeastRecentlyUsedIdleModel) {
  AddDemoModel("topics");
  AddDemoModel("ner");
  budget::FakeMeter meter;
  budget::MemoryEvents memory;
  Open("latest:1", [&](ModelRepository::Options& o) {
    control::Explicit(o, {"sentiment", "topics"});
    budget::Budget(o, &meter, 100 * kMiB);
    o.memory_event = memory.Record();
  });
  ASSERT_EQ(States("sentiment"), (Versions{{1, S::kReady}}));
  ASSERT_EQ(States("topics"), (Versions{{1, S::kReady}}));
  EXPECT_EQ(repo_->Get("topics")->versions.at(0).memory_bytes, 40 * kMiB);
  env_.Advance(absl::Seconds(1));
  ASSERT_TRUE(repo_->Resolve("sentiment", 0).ok());  // asked for now; topics not since its load
  env_.Advance(absl::Seconds(1));

  control::Answer ner;
  repo_->RequestLoad("ner", ner.done());
  ASSERT_TRUE(ner.Wait().ok()) << *ner.status;
  EXPECT_EQ(States("ner"), (Versions{{1, S::kReady}}));
  EXPECT_EQ(States("sentiment"), (Versions{{1, S::kReady}}));
  ASSERT_TRUE(events_.WaitFor("topics", 1, S::kUnloaded));
  const std::string why =
      "unloaded to make room for 'ner' within the memory budget of cpu (the least recently used "
      "idle model)";
  EXPECT_EQ(events_.Reason("topics", 1, S::kUnloading), why);
  const absl::Status gone = repo_->Resolve("topics", 0).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(gone.message(), absl::StrCat("model 'topics' is not loaded: ", why,
                                         "; a request loads it again with --load-on-demand, or an admin does "
                                         "(POST /v2/repository/models/topics/load)"));
  std::vector<ModelStatus> index = repo_->Index();
  ASSERT_EQ(index.size(), 3u);
  EXPECT_EQ(index[2].name, "topics");
  EXPECT_EQ(index[2].not_loaded, why);
  repo_->Poll();
  EXPECT_TRUE(States("topics").empty()) << "a poll does not load a resting model";

  // Loaded again, it makes room in turn: now sentiment was asked for longest ago (ner since its load).
  control::Answer topics;
  repo_->RequestLoad("topics", topics.done());
  ASSERT_TRUE(topics.Wait().ok()) << *topics.status;
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloaded));
  EXPECT_EQ(States("ner"), (Versions{{1, S::kReady}}));
  std::vector<std::string> seen = memory.Seen();
  ASSERT_EQ(seen.size(), 6u);
  std::sort(seen.begin(), seen.begin() + 2);  // the two loads at start-up, in either order
  EXPECT_EQ(seen, (std::vector<std::string>{"sentiment loaded poll", "topics loaded poll", "topics unloaded budget",
                                            "ner loaded admin", "sentiment unloaded budget", "topics loaded admin"}));
}

TEST_F(ModelRepositoryTest, ALoadTheBudgetCanNeverHoldIsRefusedAtOnceAndUnloadsNothing) {
  AddDemoModel("topics");
  std::ofstream(root_ / "topics" / "serving.json") << R"({"memory_bytes": 62914560})";  // 60 MiB
  budget::FakeMeter meter;
  Open("latest:1", [&](ModelRepository::Options& o) {
    control::Explicit(o, {"sentiment"});
    budget::Budget(o, &meter, 50 * kMiB);
  });
  control::Answer refused;
  repo_->RequestLoad("topics", refused.done());
  const std::string why =
      "model 'topics' needs about 60.0 MiB of cpu and the memory budget (50.0 MiB, --device-memory-budget) has "
      "10.0 MiB left; loaded: sentiment 40.0 MiB; it needs more than the whole budget";
  EXPECT_EQ(refused.Wait().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status->message(), absl::StrCat("model 'topics' did not load: ", why));
  EXPECT_EQ(States("sentiment"), (Versions{{1, S::kReady}})) << "nothing unloaded for a load that cannot fit";
  EXPECT_EQ(repo_->Resolve("topics", 0).status().message().rfind("model 'topics' is not loaded: " + why, 0), 0u);
}

// A model whose requests overlap is never idle: the load takes it out of service, its requests are
// answered, and the load goes on once the memory is free.
TEST_F(ModelRepositoryTest, AnAskedLoadDrainsABusyModelAndLoadsOnceItsRequestsAreAnswered) {
  AddDemoModel("topics");
  budget::FakeMeter meter;
  Open("latest:1", [&](ModelRepository::Options& o) {
    control::Explicit(o, {"sentiment"});
    budget::Budget(o, &meter, 50 * kMiB);
  });
  ServableHandle held = *repo_->Resolve("sentiment", 0);  // a request in flight: sentiment is not idle
  control::Answer loaded;
  repo_->RequestLoad("topics", loaded.done());
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloading));
  EXPECT_EQ(events_.Reason("sentiment", 1, S::kUnloading),
            "unloaded to make room for 'topics' within the memory budget of cpu (the least recently used model; its "
            "requests in flight were answered)");
  EXPECT_FALSE(loaded.Arrived()) << "its memory is not free while a request holds it";
  held.reset();  // answered
  ASSERT_TRUE(loaded.Wait().ok()) << *loaded.status;
  EXPECT_EQ(States("topics"), (Versions{{1, S::kReady}}));
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloaded));
}

// Loads waiting for room go in the order they were asked for; each request gets the version loaded
// for it, held, before the next load may take it out of service.
TEST_F(ModelRepositoryTest, LoadsOnDemandWaitForRoomInArrivalOrderAndEachRequestIsServed) {
  AddDemoModel("topics");
  AddDemoModel("ner");
  budget::FakeMeter meter;
  budget::MemoryEvents memory;
  Open("latest:1", [&](ModelRepository::Options& o) {
    control::Explicit(o, {"sentiment"});
    budget::Budget(o, &meter, 50 * kMiB);
    o.load_on_demand = true;
    o.memory_event = memory.Record();
  });
  ServableHandle held = *repo_->Resolve("sentiment", 0);
  control::Answer topics, ner;
  repo_->WhenLoaded("topics", env_.Now() + absl::Minutes(1), topics.loaded_done());
  repo_->WhenLoaded("ner", env_.Now() + absl::Minutes(1), ner.loaded_done());
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloading));
  EXPECT_TRUE(WaitsForLoad(repo_->Resolve("topics", 0).status())) << "loading: a request waits, not refused";
  EXPECT_TRUE(WaitsForLoad(repo_->Resolve("sentiment", 0).status())) << "drained: a request loads it again";
  held.reset();
  ASSERT_TRUE(topics.Wait().ok()) << *topics.status;
  ASSERT_EQ((*topics.held)->name, "topics");
  ASSERT_TRUE(events_.WaitFor("topics", 1, S::kUnloading)) << "ner's turn: topics is the one to go";
  EXPECT_FALSE(ner.Arrived()) << "topics' request still holds it";
  topics.held->reset();
  ASSERT_TRUE(ner.Wait().ok()) << *ner.status;
  EXPECT_EQ((*ner.held)->name, "ner");
  ner.held->reset();
  EXPECT_EQ(memory.Seen(),
            (std::vector<std::string>{"sentiment loaded poll", "sentiment unloaded budget", "topics loaded demand",
                                      "topics unloaded budget", "ner loaded demand"}));
}

TEST_F(ModelRepositoryTest, AtMostMaxWaitingLoadsModelsLoadOnDemandAndTheirRequestsLeaveAtTheirDeadlines) {
  AddDemoModel("topics");
  AddDemoModel("ner");
  budget::FakeMeter meter;
  Open("latest:1", [&](ModelRepository::Options& o) {
    control::Explicit(o, {"sentiment"});
    budget::Budget(o, &meter, 50 * kMiB);
    o.load_on_demand = true;
    o.max_waiting_loads = 1;
  });
  ServableHandle held = *repo_->Resolve("sentiment", 0);
  control::Answer first, second, refused;
  repo_->WhenLoaded("topics", env_.Now() + absl::Seconds(30), first.loaded_done());
  repo_->WhenLoaded("topics", env_.Now() + absl::Seconds(20), second.loaded_done());  // joins the same load
  repo_->WhenLoaded("ner", env_.Now() + absl::Seconds(30), refused.loaded_done());
  EXPECT_EQ(refused.Wait().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status->message(),
            "model 'ner' is not loaded, and 1 other models are loading on demand already, the most at once "
            "(--max-waiting-loads 1); retry with backoff");
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloading));
  env_.Advance(absl::Seconds(21));
  EXPECT_EQ(second.Wait().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(first.Arrived()) << "the load goes on for the request still waiting";
  env_.Advance(absl::Seconds(10));
  EXPECT_EQ(first.Wait().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(events_.WaitFor("topics", 1, S::kFailed)) << "nobody waits: the load gives up";
  EXPECT_EQ(events_.Reason("topics", 1, S::kFailed),
            "model 'topics' waited for room in the memory budget until the deadline of every request for it had "
            "passed");
  EXPECT_TRUE(WaitsForLoad(repo_->Resolve("topics", 0).status())) << "it rests: the next request loads it";
  held.reset();
  control::Answer later;
  repo_->WhenLoaded("ner", env_.Now() + absl::Seconds(30), later.loaded_done());
  ASSERT_TRUE(later.Wait().ok()) << *later.status;
}

TEST_F(ModelRepositoryTest, APollLoadsWhatFitsAndEvictsNothing) {
  AddDemoModel("topics");
  budget::FakeMeter meter;
  Open("latest:1", [&](ModelRepository::Options& o) {
    budget::Budget(o, &meter, 50 * kMiB);
    o.load_threads = 1;  // sentiment first
  });
  EXPECT_EQ(States("sentiment"), (Versions{{1, S::kReady}}));
  EXPECT_EQ(repo_->Resolve("topics", 0).status().message(),
            "model 'topics' is not loaded: model 'topics' needs about 40.0 MiB of cpu and the memory budget (50.0 "
            "MiB, --device-memory-budget) has 10.0 MiB left; loaded: sentiment 40.0 MiB; a poll of the store evicts "
            "no other model; a request loads it again with --load-on-demand, or an admin does (POST "
            "/v2/repository/models/topics/load)");
  repo_->Poll();
  EXPECT_EQ(States("sentiment"), (Versions{{1, S::kReady}})) << "not evicted by a later poll either";
  EXPECT_TRUE(States("topics").empty());
}

TEST_F(ModelRepositoryTest, AnIdleModelIsUnloadedAndARequestLoadsItAgain) {
  budget::MemoryEvents memory;
  Open("latest:1", [&](ModelRepository::Options& o) {
    o.unload_idle_after = absl::Minutes(10);
    o.load_on_demand = true;
    o.memory_event = memory.Record();
  });
  env_.Advance(absl::Minutes(5));
  ASSERT_TRUE(repo_->Resolve("sentiment", 0).ok());  // idle from here: due at 15 min
  env_.Advance(absl::Minutes(9));
  EXPECT_EQ(States(), (Versions{{1, S::kReady}}));
  env_.Advance(absl::Minutes(2));
  ASSERT_TRUE(events_.WaitFor("sentiment", 1, S::kUnloaded));
  EXPECT_EQ(events_.Reason("sentiment", 1, S::kUnloading),
            "unloaded after 10m without a request (--unload-idle-after)");

  const absl::Status resolved = repo_->Resolve("sentiment", 0).status();
  EXPECT_TRUE(WaitsForLoad(resolved)) << resolved;
  EXPECT_EQ(resolved.message(), "model 'sentiment' is not loaded; it loads on demand (--load-on-demand)");
  control::Answer first, second;  // two requests, one load
  repo_->WhenLoaded("sentiment", env_.Now() + absl::Minutes(1), first.loaded_done());
  repo_->WhenLoaded("sentiment", env_.Now() + absl::Minutes(1), second.loaded_done());
  ASSERT_TRUE(first.Wait().ok()) << *first.status;
  ASSERT_TRUE(second.Wait().ok()) << *second.status;
  ASSERT_NE(*first.held, nullptr);
  EXPECT_EQ(*first.held, *second.held) << "both served by the version loaded for them";
  EXPECT_EQ((*first.held)->name, "sentiment");
  first.held->reset();
  second.held->reset();
  EXPECT_TRUE(repo_->Resolve("sentiment", 0).ok());
  EXPECT_EQ(memory.Seen(),
            (std::vector<std::string>{"sentiment loaded poll", "sentiment unloaded idle", "sentiment loaded demand"}));
}

TEST_F(ModelRepositoryTest, ARequestWaitingForALoadOnDemandIsAnsweredAtItsDeadline) {
  AddDemoModel("topics");
  StuckLoad stuck{"/topics"};
  Open("latest:1", [&](ModelRepository::Options& o) {
    control::Explicit(o, {});
    o.load_on_demand = true;
    o.load = stuck.Load();
  });
  EXPECT_TRUE(WaitsForLoad(repo_->Resolve("topics", 0).status())) << "explicit: in the store, not loaded";
  control::Answer late;
  repo_->WhenLoaded("topics", env_.Now() + absl::Seconds(30), late.loaded_done());
  ASSERT_TRUE(stuck.started->WaitForNotificationWithTimeout(absl::Seconds(60)));
  // While it loads, a request for any version waits for the load too: one loading, one not known yet.
  EXPECT_TRUE(WaitsForLoad(repo_->Resolve("topics", 1).status()));
  EXPECT_TRUE(WaitsForLoad(repo_->Resolve("topics", 7).status()));
  env_.Advance(absl::Seconds(31));
  EXPECT_EQ(late.Wait().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late.status->message(), "the deadline passed while the model was loading on demand");
  stuck.Finish();
  ASSERT_TRUE(events_.WaitFor("topics", 1, S::kReady)) << "the load goes on for the next request";
  EXPECT_EQ(*late.calls, 1);
}

}  // namespace
}  // namespace qvi

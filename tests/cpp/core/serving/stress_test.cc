// Stress on the serving core, built also with ASan/UBSan and with TSan (scripts/sanitize.sh):
// 64 clients, each sending a fixed number of requests of random sizes through InferenceService,
// some with deadlines that pass, some cancelled, while a new version of the model is dropped into
// the store and switched to. Every request must be answered exactly once, and every answer must be
// the right one for its own texts (equal to that text served alone). The answers are made on an
// answer pool, as the server makes them (ModelRunner), so batches overlap their answers.
// And concurrent callers on three models under a memory budget that holds one: every request waits
// for its model's load on demand, which unloads the others (busy ones drained), and is answered once.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "server/core/base/sync.h"
#include "server/core/repository/model_repository.h"
#include "server/core/sched/executor.h"
#include "server/core/serving/inference_service.h"
#include "tests/cpp/test_util/run.h"
#include "tests/cpp/test_util/store.h"

namespace qvi {
namespace {

namespace fs = std::filesystem;

constexpr int kClients = 64;
constexpr int kRequestsPerClient = 6;

struct Expected {
  std::vector<std::pair<std::string, float>> labels;
  std::vector<float> attention;
};

enum class Kind { kNormal, kShortDeadline, kCancelled };

class StressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    demo_ = testing::DemoStore() / "sentiment" / "1" / "model.pt";
    store_ = std::make_unique<testing::TempStore>("stress_test");
    store_->CopyDemoFile("sentiment/1/model.pt", "sentiment/1/model.pt");
    root_ = store_->path();
  }

  std::unique_ptr<testing::TempStore> store_;
  fs::path demo_, root_;
};

std::vector<std::string> MakeTexts(std::mt19937& rng, int count) {
  const std::vector<std::string> words = {"a",    "film",  "good",   "bad",   "dull",   "moving", "funny",
                                          "slow", "great", "boring", "story", "acting", "!",      "not",
                                          "very", "and",   "the",    "😀",     "東京"};
  std::vector<std::string> texts;
  for (int i = 0; i < count; ++i) {
    const int n = std::uniform_int_distribution<int>(1, 40)(rng);
    std::string t;
    for (int w = 0; w < n; ++w)
      t += (w ? " " : "") + words[std::uniform_int_distribution<size_t>(0, words.size() - 1)(rng)];
    texts.push_back(t);
  }
  return texts;
}

InferenceRequest Request(std::vector<std::string> texts) {
  InferenceRequest r;
  r.model = "sentiment";
  r.texts = std::move(texts);
  r.options.top_k = 2;
  r.options.Ask(OutputSwitch::kAttention);
  return r;
}

TEST_F(StressTest, EveryRequestIsAnsweredOnceAndCorrectlyUnderDeadlinesCancellationsAndASwitch) {
  Executor answers(2, 0, Env::Default(), "qvi-answer");  // outlives the repository's runners
  ModelRepository::Options o;
  o.root = root_.string();
  o.defaults.device = "cpu";
  o.answers = &answers;
  auto repo = ModelRepository::Create(o);
  ASSERT_TRUE(repo.ok()) << repo.status();
  (*repo)->Poll();
  Executor executor(2, 4096);
  InferenceService service(repo->get(), &executor, {});

  std::mt19937 rng(1234);
  const std::vector<std::string> pool = MakeTexts(rng, 24);
  std::map<std::string, Expected> expected;
  for (const std::string& text : pool) {
    absl::StatusOr<InferenceResponse> alone = testing::RunAndWait(service, Method::kClassify, Request({text}));
    ASSERT_TRUE(alone.ok()) << alone.status();
    Expected& e = expected[text];
    e.labels = alone->results[0].labels;
    for (const TokenOutput& t : alone->results[0].tokens) e.attention.push_back(*t.attention);
  }

  struct Outcome {
    Kind kind = Kind::kNormal;
    std::vector<std::string> texts;
    std::atomic<int> calls{0};
    absl::StatusOr<InferenceResponse> answer = absl::UnknownError("unanswered");
  };
  std::vector<Outcome> outcomes(kClients * kRequestsPerClient);
  std::atomic<int> answered{0};
  std::atomic<bool> switched{false};
  Notification switch_done;

  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 local(static_cast<uint32_t>(c) * 7919u + 1u);
      for (int i = 0; i < kRequestsPerClient; ++i) {
        // The last quarter goes after the switch, however long the new version takes to load on a
        // busy machine, so that version 2 surely serves some.
        if (i == kRequestsPerClient * 3 / 4) switch_done.WaitForNotification();
        Outcome& out = outcomes[c * kRequestsPerClient + i];
        const int n = std::uniform_int_distribution<int>(1, 5)(local);
        for (int k = 0; k < n; ++k)
          out.texts.push_back(pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(local)]);
        const int roll = std::uniform_int_distribution<int>(0, 99)(local);
        out.kind = roll < 70 ? Kind::kNormal : roll < 85 ? Kind::kShortDeadline : Kind::kCancelled;
        InferenceRequest r = Request(out.texts);
        auto cancelled = std::make_shared<std::atomic<bool>>(false);
        if (out.kind == Kind::kShortDeadline) {
          // Some already past, some passing about when the batch forms.
          r.deadline = service.env().Now() + absl::Microseconds(std::uniform_int_distribution<int>(-1000, 2000)(local));
        }
        if (out.kind == Kind::kCancelled) r.is_cancelled = [cancelled] { return cancelled->load(); };
        Notification done;
        service.Submit(Method::kClassify, r, [&out, &done, &answered](absl::StatusOr<InferenceResponse> a) {
          out.answer = std::move(a);
          out.calls++;
          answered++;
          done.Notify();
        });
        if (out.kind == Kind::kCancelled) cancelled->store(true);
        done.WaitForNotification();
      }
    });
  }
  // Half-way through, a new version is dropped into the store and switched to under traffic.
  std::thread operator_thread([&] {
    while (answered.load() < kClients * kRequestsPerClient / 2) std::this_thread::yield();
    const fs::path staging = root_ / "sentiment" / ".2.tmp";
    fs::create_directories(staging);
    fs::copy_file(demo_, staging / "model.pt");
    fs::rename(staging, root_ / "sentiment" / "2");
    (*repo)->Poll();
    switched = true;
    switch_done.Notify();
  });
  for (std::thread& t : clients) t.join();
  operator_thread.join();
  executor.Shutdown();
  (*repo)->Shutdown();  // after this nothing can call back any more

  ASSERT_TRUE(switched.load());
  std::map<Kind, std::map<absl::StatusCode, int>> seen;
  int v2_answers = 0;
  for (const Outcome& out : outcomes) {
    ASSERT_EQ(out.calls.load(), 1) << "every request is answered exactly once";
    const absl::StatusCode code = out.answer.status().code();
    seen[out.kind][code]++;
    if (out.kind == Kind::kNormal) {
      ASSERT_TRUE(out.answer.ok()) << out.answer.status();
    } else if (out.kind == Kind::kShortDeadline) {
      ASSERT_TRUE(code == absl::StatusCode::kOk || code == absl::StatusCode::kDeadlineExceeded) << out.answer.status();
    } else {
      ASSERT_TRUE(code == absl::StatusCode::kOk || code == absl::StatusCode::kCancelled) << out.answer.status();
    }
    if (!out.answer.ok()) continue;
    v2_answers += out.answer->version == 2;
    ASSERT_EQ(out.answer->results.size(), out.texts.size());
    for (size_t i = 0; i < out.texts.size(); ++i) {
      const Expected& e = expected.at(out.texts[i]);
      const TextResult& got = out.answer->results[i];
      ASSERT_EQ(got.labels.size(), e.labels.size());
      for (size_t k = 0; k < e.labels.size(); ++k) {
        ASSERT_EQ(got.labels[k].first, e.labels[k].first) << out.texts[i];
        ASSERT_NEAR(got.labels[k].second, e.labels[k].second, 1e-5) << out.texts[i];
      }
      ASSERT_EQ(got.tokens.size(), e.attention.size());
      for (size_t t = 0; t < e.attention.size(); ++t) ASSERT_NEAR(*got.tokens[t].attention, e.attention[t], 1e-5);
    }
  }
  // The drops really happened: expired and cancelled requests were refused before the model.
  EXPECT_GT(seen[Kind::kShortDeadline][absl::StatusCode::kDeadlineExceeded], 0);
  EXPECT_GT(seen[Kind::kCancelled][absl::StatusCode::kCancelled], 0);
  EXPECT_GT(v2_answers, 0) << "the new version served after the switch";
}

TEST_F(StressTest, CallersOnMoreModelsThanTheBudgetHoldsAreEachAnsweredOnce) {
  for (const char* model : {"topics", "ner"}) {
    store_->CopyDemoFile(std::string(model) + "/1/model.pt", std::string(model) + "/1/model.pt");
  }
  for (const char* model : {"sentiment", "topics", "ner"}) {
    store_->Write(std::string(model) + "/serving.json", R"({"memory_bytes": 41943040})");  // 40 MiB
  }
  Executor answers(2, 0, Env::Default(), "qvi-answer");
  ModelRepository::Options o;
  o.root = root_.string();
  o.defaults.device = "cpu";
  o.answers = &answers;
  o.model_control = ModelControl::kExplicit;
  o.load_at_start = {"sentiment"};
  o.memory_budget.bytes = 60 << 20;  // one model and a half
  o.load_on_demand = true;
  std::atomic<int> evictions{0};
  o.memory_event = [&evictions](const std::string&, bool loaded, const char*) { evictions += loaded ? 0 : 1; };
  auto repo = ModelRepository::Create(o);
  ASSERT_TRUE(repo.ok()) << repo.status();
  (*repo)->Poll();
  Executor executor(2, 4096);
  InferenceService service(repo->get(), &executor, {});

  constexpr int kCallers = 12, kCalls = 4;
  const std::vector<std::string> models = {"sentiment", "topics", "ner"};
  std::vector<std::atomic<int>> calls(kCallers * kCalls);
  std::vector<absl::StatusOr<InferenceResponse>> outcomes(kCallers * kCalls, absl::UnknownError("unanswered"));
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      const std::string& model = models[static_cast<size_t>(c) % models.size()];
      for (int i = 0; i < kCalls; ++i) {
        const size_t at = static_cast<size_t>(c * kCalls + i);
        InferenceRequest r = Request({"A moving, funny film about Paris."});
        r.model = model;
        r.options = {};
        r.deadline = service.env().Now() + absl::Minutes(5);
        Notification done;
        service.Submit(model == "ner" ? Method::kTag : Method::kClassify, r,
                       [&, at](absl::StatusOr<InferenceResponse> a) {
                         outcomes[at] = std::move(a);
                         calls[at]++;
                         done.Notify();
                       });
        done.WaitForNotification();
      }
    });
  }
  for (std::thread& t : callers) t.join();
  executor.Shutdown();
  (*repo)->Shutdown();
  for (int c = 0; c < kCallers; ++c) {
    for (int i = 0; i < kCalls; ++i) {
      const size_t at = static_cast<size_t>(c * kCalls + i);
      ASSERT_EQ(calls[at].load(), 1) << "every request is answered exactly once";
      ASSERT_TRUE(outcomes[at].ok()) << outcomes[at].status();
      EXPECT_EQ(outcomes[at]->model, models[static_cast<size_t>(c) % models.size()]);
    }
  }
  EXPECT_GT(evictions.load(), 0) << "the models took turns";
}

}  // namespace
}  // namespace qvi

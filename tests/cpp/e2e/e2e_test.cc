// End to end: the real qvi-server binary on a free port with a copy of the demo store (plus a
// corrupt version), called through the generated C++ stubs and qvi-client. What a C++ caller sees:
// the answers and errors of both APIs, qvi-client, 64 clients with deadlines and cancellations,
// SIGTERM under load. Health, reflection, logs, metrics and the Python clients are the Python
// suite's (tests/python/test_e2e.py and beside it); each behaviour is pinned in one of the two.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/synchronization/mutex.h"

#include "grpc/health/v1/health.grpc.pb.h"
#include "inference/open_inference_grpc.grpc.pb.h"
#include "qvi/serving/v1/inference.grpc.pb.h"
#include "tests/cpp/test_util/server_process.h"

namespace v1 = qvi::serving::v1;
namespace fs = std::filesystem;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

namespace {

using qvi::testing::ServerProcess;

class EndToEnd : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    server_->Start();
  }
  static void TearDownTestSuite() { delete server_; }

  static std::unique_ptr<v1::Inference::Stub> Stub() { return v1::Inference::NewStub(server_->channel()); }

  static grpc::Status Classify(const v1::ClassifyRequest& req, v1::ClassifyResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return Stub()->Classify(&ctx, req, resp);
  }

  static ServerProcess* server_;
};

ServerProcess* EndToEnd::server_ = nullptr;

v1::ClassifyRequest SentimentRequest(std::vector<std::string> texts) {
  v1::ClassifyRequest r;
  r.mutable_model()->set_name("sentiment");
  for (auto& t : texts) r.add_texts(t);
  return r;
}

TEST_F(EndToEnd, ClassifyWithExplanations) {
  v1::ClassifyRequest req = SentimentRequest({"A gorgeous, moving film.", "北京 café 👍🏽 dull"});
  req.mutable_options()->set_top_k(2);
  req.mutable_options()->set_attention(true);
  req.mutable_options()->set_gates(true);
  req.set_request_id("abc-1");
  v1::ClassifyResponse resp;
  ASSERT_TRUE(Classify(req, &resp).ok());
  EXPECT_EQ(resp.model().version(), 1);
  EXPECT_EQ(resp.request_id(), "abc-1");
  ASSERT_EQ(resp.results_size(), 2);
  EXPECT_EQ(resp.results(0).labels_size(), 2);
  float sum = 0;
  for (const auto& t : resp.results(1).tokens()) {
    ASSERT_TRUE(t.has_attention() && t.has_gate());
    sum += t.attention();
  }
  EXPECT_NEAR(sum, 1.0f, 1e-5);
  const auto& toks = resp.results(1).tokens();
  ASSERT_EQ(toks.size(), 5);
  EXPECT_EQ(toks[0].text(), "北");
  EXPECT_EQ(toks[2].text(), "café");
  EXPECT_EQ(toks[2].start(), 3u);
  EXPECT_EQ(toks[2].end(), 7u);
  EXPECT_EQ(toks[3].text(), "👍🏽");
  EXPECT_EQ(toks[3].start(), 8u);
  EXPECT_EQ(toks[3].end(), 10u);
}

// The Open Inference Protocol on the same port (tests/python/test_oip.py covers it more, and runs
// against the ASan server in scripts/sanitize.sh):
// ModelInfer with raw contents, every output of the classifier, and a malformed raw buffer.
TEST_F(EndToEnd, ModelInferAnswersAsClassify) {
  const std::vector<std::string> texts = {"A gorgeous, moving film.", "北京 café 👍🏽 dull"};
  v1::ClassifyRequest native = SentimentRequest(texts);
  native.mutable_options()->set_attention(true);
  v1::ClassifyResponse want;
  ASSERT_TRUE(Classify(native, &want).ok());

  auto oip = inference::GRPCInferenceService::NewStub(server_->channel());
  inference::ModelInferRequest req;
  req.set_model_name("sentiment");
  auto* input = req.add_inputs();
  input->set_name("text");
  input->set_datatype("BYTES");
  input->add_shape(2);
  std::string raw;
  for (const std::string& t : texts) {
    const uint32_t n = static_cast<uint32_t>(t.size());
    raw.append(reinterpret_cast<const char*>(&n), 4);  // little-endian, as the protocol says
    raw += t;
  }
  req.add_raw_input_contents(raw);
  for (const char* name : {"label", "probabilities", "labels", "scores", "tokens", "token_count", "truncated",
                           "attention", "gates", "layer_index", "layer_gates", "layer_attention"}) {
    req.add_outputs()->set_name(name);
  }
  inference::ModelInferResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    ASSERT_TRUE(oip->ModelInfer(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(resp.model_version(), "1");
  ASSERT_EQ(resp.raw_output_contents_size(), 12);
  const std::string& labels = resp.raw_output_contents(0);
  const std::string& best = want.results(0).labels(0).label();
  EXPECT_EQ(labels.substr(4, best.size()), best);
  const std::string& attention = resp.raw_output_contents(7);
  const int t = static_cast<int>(resp.outputs(7).shape(1));
  for (int i = 0; i < want.results(1).tokens_size(); ++i) {
    float a = 0;
    std::memcpy(&a, attention.data() + (t + i) * sizeof(float), sizeof(float));
    EXPECT_NEAR(a, want.results(1).tokens(i).attention(), 1e-5);
  }

  req.set_raw_input_contents(0, raw.substr(0, raw.size() - 1));
  grpc::ClientContext ctx;
  const grpc::Status bad = oip->ModelInfer(&ctx, req, &resp);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.error_message().find("raw_input_contents[0]: element 1"), std::string::npos) << bad.error_message();
}

TEST_F(EndToEnd, TagReturnsTokensAndSpans) {
  v1::TagRequest req;
  req.mutable_model()->set_name("ner");
  req.add_texts("Justin Bieber flew to New York with Microsoft people .");
  v1::TagResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(Stub()->Tag(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_EQ(resp.results(0).tokens_size(), 10);
  for (const auto& t : resp.results(0).tokens()) EXPECT_FALSE(t.tag().empty());
  for (const auto& s : resp.results(0).spans())
    EXPECT_EQ(req.texts(0).substr(s.byte_start(), s.byte_end() - s.byte_start()), s.text());
}

TEST_F(EndToEnd, DiscoveryShowsStatesAndMetadata) {
  v1::ListModelsResponse list;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(Stub()->ListModels(&ctx, v1::ListModelsRequest(), &list).ok());
  }
  ASSERT_EQ(list.models_size(), 3);
  EXPECT_EQ(list.models(0).name(), "ner");
  EXPECT_EQ(list.models(2).name(), "topics");
  const v1::ModelInfo& sentiment = list.models(1);
  ASSERT_EQ(sentiment.versions_size(), 2);
  EXPECT_EQ(sentiment.versions(0).version(), 7);
  EXPECT_EQ(sentiment.versions(0).state(), v1::MODEL_STATE_FAILED);
  EXPECT_NE(sentiment.versions(0).reason().find("cannot read"), std::string::npos);
  EXPECT_EQ(sentiment.versions(1).state(), v1::MODEL_STATE_READY);
  const v1::ModelMetadata& md = sentiment.versions(1).metadata();
  EXPECT_EQ(md.task(), "classification");
  EXPECT_EQ(md.labels_size(), 2);
  EXPECT_EQ(md.device(), "cpu");
  EXPECT_EQ(md.tokenizer().max_tokens(), 128);
  EXPECT_GT(md.layers(), 0);
  EXPECT_EQ(md.batching().max_batch_size(), 4);  // from serving.json
  EXPECT_EQ(md.batching().instances(), 2);
  EXPECT_EQ(md.batching().max_batch_tokens(), 4096);  // from the manifest
  v1::GetModelRequest get;
  get.mutable_model()->set_name("ner");
  v1::GetModelResponse one;
  grpc::ClientContext ctx;
  ASSERT_TRUE(Stub()->GetModel(&ctx, get, &one).ok());
  EXPECT_EQ(one.model().versions(0).metadata().tag_scheme(), "BIO");
  get.mutable_model()->set_name("missing");
  grpc::ClientContext ctx2;
  EXPECT_EQ(Stub()->GetModel(&ctx2, get, &one).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(EndToEnd, ErrorsFollowTheDesignTable) {
  v1::ClassifyResponse resp;
  v1::ClassifyRequest req = SentimentRequest({"x"});
  req.mutable_model()->set_name("nope");
  grpc::Status s = Classify(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("models: ner, sentiment, topics"), std::string::npos);
  req = SentimentRequest({"x"});
  req.mutable_model()->set_version(7);
  s = Classify(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("FAILED"), std::string::npos);
  s = Classify(SentimentRequest({}), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("texts: empty"), std::string::npos);
  s = Classify(SentimentRequest(std::vector<std::string>(9, "a")), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("limit of 8"), std::string::npos);
  s = Classify(SentimentRequest({std::string(1001, 'a')}), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("texts[0]: 1001 bytes exceed the limit of 1000"), std::string::npos);
  req = SentimentRequest({"x"});
  req.mutable_options()->set_top_k(-2);
  EXPECT_EQ(Classify(req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  std::string words;
  for (int i = 0; i < 150; ++i) words += "w ";
  req = SentimentRequest({words});
  req.mutable_options()->set_truncation(v1::TRUNCATION_POLICY_ERROR);
  s = Classify(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("max_tokens of 128"), std::string::npos);
  req.mutable_options()->set_truncation(v1::TRUNCATION_POLICY_TRUNCATE);
  ASSERT_TRUE(Classify(req, &resp).ok());
  EXPECT_TRUE(resp.results(0).truncated());
  EXPECT_EQ(resp.results(0).num_tokens(), 150u);
}

TEST_F(EndToEnd, InvalidUtf8IsRejected) {
  v1::ClassifyResponse resp;
  grpc::Status s = Classify(SentimentRequest({"ok", "bad \xff byte"}), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), "texts[1]: invalid UTF-8 at byte 4");
}

// A shell command's exit code and standard output.
std::pair<int, std::string> RunShell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = pclose(p);
  return {WEXITSTATUS(rc), out};
}

TEST_F(EndToEnd, QviClientPrintsLabelsAndJson) {
  const std::string base = std::string(QVI_CLIENT_BINARY) + " --server " + server_->address() + " --color never ";
  const auto run = RunShell;
  auto [rc, human] = run(base + "classify --model sentiment --attention --gates 'A fine film.'");
  EXPECT_EQ(rc, 0) << human;
  EXPECT_TRUE(human.find("positive") != std::string::npos || human.find("negative") != std::string::npos) << human;
  EXPECT_NE(human.find("α="), std::string::npos) << human;
  EXPECT_NE(human.find("β="), std::string::npos) << human;
  auto [rc2, json] = run(base + "--json tag --model ner 'Anna flew to Berlin'");
  EXPECT_EQ(rc2, 0) << json;
  EXPECT_NE(json.find("\"tokens\""), std::string::npos) << json;
  auto [rc3, models] = run(base + "models");
  EXPECT_NE(models.find("sentiment"), std::string::npos);
  EXPECT_NE(models.find("FAILED"), std::string::npos);
  EXPECT_EQ(run(base + "health").first, 0);
  auto [rc4, err] = run(base + "classify --model nope x 2>&1");
  EXPECT_EQ(rc4, 1);
  EXPECT_NE(err.find("not found"), std::string::npos) << err;
  // Global options after the subcommand, as people type them: the same answer as before it.
  const std::string client = std::string(QVI_CLIENT_BINARY) + " ";
  auto [rc5, after] =
      run(client + "tag --model ner --server " + server_->address() + " --json --timeout 20 'Anna flew to Berlin'");
  EXPECT_EQ(rc5, 0) << after;
  const std::regex request_id(R"("request_id": "[^"]*")");  // the server numbers its requests
  EXPECT_EQ(std::regex_replace(after, request_id, ""), std::regex_replace(json, request_id, ""));
  // Per-layer outputs print their numbers in the terminal too: β per token, each token's top keys.
  auto [rc7, layers] =
      run(base + "classify --model sentiment --layer-gates --attention-maps --layers 1 --heads 0 'A fine film.'");
  EXPECT_EQ(rc7, 0) << layers;
  EXPECT_TRUE(std::regex_search(layers, std::regex(R"(  layer 1, head 0\n    β: A\(0\.\d\d\) fine\(0\.\d\d\))")))
      << layers;
  EXPECT_TRUE(std::regex_search(layers, std::regex(R"(      film +-> \S+\(0\.\d\d\) \S+\(0\.\d\d\) \S+\(0\.\d\d\))")))
      << layers;
  EXPECT_EQ(layers.find("[0,1)"), std::string::npos) << "no bare token lines nobody asked for";
  auto [rc6, unknown] = run(client + "classify --model sentiment --no-such-option x 2>&1");
  EXPECT_NE(rc6, 0) << unknown;
  EXPECT_NE(unknown.find("--no-such-option"), std::string::npos) << unknown;
}

// Standard input past one request's texts goes in chunks answered in order; blank lines are skipped
// with a note, invalid UTF-8 is refused naming the line; errors print their code's name and a hint.
TEST_F(EndToEnd, QviClientChunksStandardInputAndNamesItsErrors) {
  const auto run = RunShell;
  // A name of this process's own: two runs of the suite (two clones) must not write one file.
  const std::string input = ::testing::TempDir() + "/qvi_client_stdin." + std::to_string(getpid()) + ".txt";
  {
    std::ofstream f(input, std::ios::binary);
    for (int i = 0; i < 30; ++i) f << "line " << i << (i == 7 || i == 15 ? "\n  \n" : "\n");
  }
  const std::string base = std::string(QVI_CLIENT_BINARY) + " --server " + server_->address() + " --color never ";
  auto [rc, out] = run(base + "--chunk 8 classify --model sentiment - < " + input + " 2>&1");
  ASSERT_EQ(rc, 0) << out.substr(0, 2000);
  EXPECT_NE(out.find("qvi-client: skipped 2 blank line(s) of standard input"), std::string::npos);
  size_t at = 0;
  for (int i = 0; i < 30; ++i) {  // every text answered, in the order given, across four requests (8 at most each)
    at = out.find("line " + std::to_string(i) + "\n", at);
    ASSERT_NE(at, std::string::npos) << "line " << i << " missing or out of order";
  }
  {
    std::ofstream f(input, std::ios::binary);
    f << "fine\nbad \xC3\x28 byte\n";
  }
  auto [rc2, utf8] = run(base + "classify --model sentiment - < " + input + " 2>&1");
  EXPECT_EQ(rc2, 2);
  EXPECT_NE(utf8.find("line 2 of standard input is not valid UTF-8 (byte 5)"), std::string::npos) << utf8;
  auto [rc8, arg] = run(base + "classify --model sentiment fine \"$(printf 'bad \\377')\" 2>&1");
  EXPECT_EQ(rc8, 2);
  EXPECT_NE(arg.find("qvi-client: text 2 is not valid UTF-8 (byte 5)"), std::string::npos) << arg;
  auto [rc3, missing] = run(base + "classify --model nope x 2>&1");
  EXPECT_EQ(rc3, 1);
  EXPECT_NE(missing.find("error: NOT_FOUND: "), std::string::npos) << missing;
  EXPECT_NE(missing.find("hint: qvi-client models lists the models"), std::string::npos) << missing;
  auto [rc4, typo] = run(base + "clasify --model sentiment x 2>&1");
  EXPECT_NE(rc4, 0);
  EXPECT_NE(typo.find("'clasify' is not a subcommand: use classify, tag, models, shadow, health or batch"),
            std::string::npos)
      << typo;
  auto [rc5, nobody] = run(std::string(QVI_CLIENT_BINARY) + " --server 127.0.0.1:1 --timeout 5 health 2>&1");
  EXPECT_EQ(rc5, 1);
  EXPECT_NE(nobody.find("error: UNAVAILABLE: "), std::string::npos) << nobody;
  EXPECT_NE(nobody.find("hint: no server answered at 127.0.0.1:1: start one with scripts/run.sh"), std::string::npos)
      << nobody;
  std::filesystem::remove(input);
}

// 64 clients through gRPC, each sending a fixed number of requests of random sizes; some with
// deadlines that pass around the time their batch forms, some cancelled by the client right after
// sending. Every call ends once, every OK answer is the right one for its own texts (equal to the
// text served alone), the server logs each request it took at most once, and it keeps serving.
TEST_F(EndToEnd, StressSixtyFourClientsWithDeadlinesAndCancellations) {
  std::mt19937 rng(99);
  const std::vector<std::string> words = {"good", "bad", "film", "dull", "moving", "a", "very", "not", "😀", "東京"};
  std::vector<std::string> pool;
  for (int i = 0; i < 16; ++i) {
    std::string t;
    const int n = std::uniform_int_distribution<int>(1, 30)(rng);
    for (int w = 0; w < n; ++w)
      t += (w ? " " : "") + words[std::uniform_int_distribution<size_t>(0, words.size() - 1)(rng)];
    pool.push_back(t);
  }
  std::map<std::string, v1::Classification> alone;
  for (const std::string& t : pool) {
    v1::ClassifyRequest req = SentimentRequest({t});
    req.mutable_options()->set_top_k(2);
    v1::ClassifyResponse resp;
    ASSERT_TRUE(Classify(req, &resp).ok());
    alone[t] = resp.results(0);
  }
  enum Kind { kNormal, kDeadline, kCancel };
  std::atomic<int> failures{0}, ok{0}, expired{0}, cancelled{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 64; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 local(static_cast<uint32_t>(c) + 1000u);
      auto stub = Stub();
      for (int i = 0; i < 5; ++i) {
        std::vector<std::string> texts;
        const int n = std::uniform_int_distribution<int>(1, 6)(local);
        for (int k = 0; k < n; ++k)
          texts.push_back(pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(local)]);
        v1::ClassifyRequest req = SentimentRequest(texts);
        req.mutable_options()->set_top_k(2);
        req.set_request_id("st-" + std::to_string(c) + "-" + std::to_string(i));
        const int roll = std::uniform_int_distribution<int>(0, 99)(local);
        const Kind kind = roll < 70 ? kNormal : roll < 85 ? kDeadline : kCancel;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         (kind == kDeadline
                              ? std::chrono::microseconds(std::uniform_int_distribution<int>(100, 3000)(local))
                              : std::chrono::microseconds(60'000'000)));
        v1::ClassifyResponse resp;
        std::mutex m;
        std::condition_variable cv;
        int calls = 0;
        grpc::Status status;
        stub->async()->Classify(&ctx, &req, &resp, [&](grpc::Status s) {
          std::lock_guard<std::mutex> l(m);
          status = s;
          ++calls;
          cv.notify_all();
        });
        if (kind == kCancel) ctx.TryCancel();
        {
          std::unique_lock<std::mutex> l(m);
          cv.wait(l, [&] { return calls > 0; });
        }
        const grpc::StatusCode code = status.error_code();
        const bool allowed = code == grpc::StatusCode::OK ||
                             (kind == kDeadline && code == grpc::StatusCode::DEADLINE_EXCEEDED) ||
                             (kind == kCancel && code == grpc::StatusCode::CANCELLED);
        if (!allowed) {
          ADD_FAILURE() << "request st-" << c << "-" << i << " kind " << kind << ": " << code << " "
                        << status.error_message();
          failures++;
          continue;
        }
        expired += code == grpc::StatusCode::DEADLINE_EXCEEDED;
        cancelled += code == grpc::StatusCode::CANCELLED;
        if (!status.ok()) continue;
        ok++;
        if (resp.results_size() != n) {
          ADD_FAILURE() << "st-" << c << "-" << i << ": " << resp.results_size() << " results for " << n << " texts";
          failures++;
          continue;
        }
        for (int k = 0; k < n; ++k) {
          const v1::Classification& want = alone[texts[k]];
          const v1::Classification& got = resp.results(k);
          bool same = got.labels_size() == want.labels_size();
          for (int l = 0; same && l < want.labels_size(); ++l) {
            same = got.labels(l).label() == want.labels(l).label() &&
                   std::abs(got.labels(l).score() - want.labels(l).score()) < 1e-5;
          }
          if (!same) {
            ADD_FAILURE() << "st-" << c << "-" << i << " text " << k << " differs from the text served alone";
            failures++;
          }
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(ok.load(), 0);
  // Both kinds of early end really happened (about 48 calls of each kind were sent; a cancel right
  // after sending, or a deadline of 100 µs to 3 ms with 64 clients on the machine, cannot all lose).
  EXPECT_GT(expired.load(), 0);
  EXPECT_GT(cancelled.load(), 0);
  // The server is still up and answers.
  v1::ClassifyResponse after;
  ASSERT_TRUE(Classify(SentimentRequest({"still serving"}), &after).ok());
  // Each request the server took is logged once: no request was answered twice.
  const std::string log = server_->Log();
  std::map<std::string, int> lines;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("request_id=\"st-");
    if (at != std::string::npos) lines[line.substr(at, line.find('"', at + 13) - at)]++;
  }
  for (const auto& [id, n] : lines) EXPECT_EQ(n, 1) << id;
  EXPECT_GE(static_cast<int>(lines.size()), ok.load());
  std::cout << "[stress] " << ok.load() << " OK, " << expired.load() << " DEADLINE_EXCEEDED, " << cancelled.load()
            << " CANCELLED of 320 calls\n";
}

// Last (gtest runs tests in order within a file): SIGTERM while 8 clients keep sending. Health reads
// NOT_SERVING at once, while calls are still taken (--shutdown-delay-seconds). Every call
// that reached the service (one access-log line each) is answered OK and received by its client;
// calls that arrive once shutdown began are refused by gRPC itself (UNAVAILABLE, or CANCELLED for
// a call cut before any handler ran); the process exits 0.
// SIGTERM ends the server, so this test has a server of its own (the others share one).
TEST(Shutdown, SigtermUnderLoadAnswersEveryAcceptedRequest) {
  auto server_ = std::make_unique<ServerProcess>();
  server_->Start("shutdown");
  std::atomic<int> ok{0};
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  std::map<int, int> others;  // status code -> count, for anything but OK and UNAVAILABLE
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
      auto stub = v1::Inference::NewStub(channel);
      for (int i = 0; !stop.load(); ++i) {
        v1::ClassifyRequest req =
            SentimentRequest({"request " + std::to_string(c) + " " + std::to_string(i), "more words"});
        req.set_request_id("zz-" + std::to_string(c) + "-" + std::to_string(i));
        v1::ClassifyResponse resp;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        grpc::Status s = stub->Classify(&ctx, req, &resp);
        if (s.ok()) {
          ok++;
          EXPECT_EQ(resp.results_size(), 2);
        } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::CANCELLED) {
          return;  // refused by gRPC during shutdown
        } else {
          absl::MutexLock l(&mu);
          others[s.error_code()]++;
          return;
        }
      }
    });
  }
  while (ok.load() < 200) std::this_thread::yield();  // waits on the clients' progress, not on a clock
  server_->Signal(SIGTERM);
  {
    // A new connection, as a readiness probe makes: NOT_SERVING during the delay.
    auto health =
        grpc::health::v1::Health::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    HealthCheckResponse::ServingStatus seen = HealthCheckResponse::SERVING;
    // Bounded by the delay the server was given (2 s); the signal is handled within milliseconds.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (seen == HealthCheckResponse::SERVING && std::chrono::steady_clock::now() < until) {
      HealthCheckRequest req;
      HealthCheckResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
      grpc::Status s = health->Check(&ctx, req, &resp);
      ASSERT_TRUE(s.ok()) << "health refused during the shutdown delay: " << s.error_message();
      seen = resp.status();
    }
    EXPECT_EQ(seen, HealthCheckResponse::NOT_SERVING);
  }
  const int code = server_->Wait();
  stop = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(code, 0);
  EXPECT_GE(ok.load(), 200);
  absl::MutexLock l(&mu);
  EXPECT_TRUE(others.empty()) << "unexpected status codes, e.g. " << (others.empty() ? 0 : others.begin()->first);
  const std::string log = server_->Log();
  EXPECT_NE(log.find("model queues drained"), std::string::npos) << log;
  // This test's own calls only (its own "zz-" ids, as it also makes health calls).
  int accepted = 0, answered_ok = 0;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("access method=Classify") == std::string::npos || line.find("request_id=\"zz-") == std::string::npos)
      continue;
    ++accepted;
    answered_ok += line.find(" status=0 ") != std::string::npos;
  }
  EXPECT_EQ(answered_ok, accepted) << "an accepted request was not answered OK:\n" << log;
  EXPECT_EQ(accepted, ok.load()) << "answers the server sent and answers the clients got differ";
}

}  // namespace

// Each front end in process against a fake core (server/frontend/core.h): native gRPC, OIP gRPC,
// HTTP/JSON and KServe REST hand the core the request the client sent, prepared alike (request id,
// deadline, the hook that holds the answer's bytes), and turn what the core answers — an answer, an
// error of any code, an answer over the send limit — into their protocol's answer, exactly once, with
// the same messages. The repository holds the real demo models (OIP plans against a manifest); the
// fake core never runs them.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "inference/open_inference_grpc.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "qvi/serving/v1/inference.grpc.pb.h"
#include "server/core/base/sync.h"
#include "server/core/repository/catalog.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/frontend/infer_steps.h"
#include "server/frontend/oip/api.h"
#include "server/grpc/native/native_service.h"
#include "server/grpc/oip/oip_service.h"
#include "server/grpc/tei/tei_service.h"
#include "server/http/http_api.h"
#include "tei/v1/tei.grpc.pb.h"
#include "tests/cpp/test_util/run.h"
#include "tests/cpp/test_util/store.h"

namespace qvi {
namespace {

namespace v1 = ::qvi::serving::v1;

// Answers every Submit at once from the calling thread with what the test set, and keeps the
// request it was handed.
class FakeCore final : public Core {
 public:
  explicit FakeCore(const ModelRepository* repository) : repository_(repository) {}

  void Submit(Method method, InferenceRequest request, Done done, ServableHandle servable) override {
    {
      MutexLock lock(&mu_);
      ++calls_;
      method_ = method;
      had_servable_ = servable != nullptr;
      if (request.hold_answer_bytes) held_ = request.hold_answer_bytes(hold_);
      request_ = std::move(request);
      if (holding_) {  // answered by ReleaseHeld()
        waiting_.push_back(std::move(done));
        max_waiting_ = std::max(max_waiting_, static_cast<int>(waiting_.size()));
        return;
      }
    }
    Answer(std::move(done), std::move(servable));
  }
  // Answers what Submit kept (the last request's answer for each).
  void Answer(Done done, ServableHandle servable = nullptr) {
    if (!error_.ok()) return done(error_);
    std::string model, request_id;
    int64_t version = 0;
    size_t texts = 0;
    {
      MutexLock lock(&mu_);
      model = request_.model;
      version = request_.version;
      request_id = request_.request_id;
      texts = request_.texts.size();
    }
    // The manifest the answer is read against, as the core gives it: the resolved version's.
    if (servable == nullptr) {
      absl::StatusOr<ServableHandle> resolved = repository_->Resolve(model, version);
      if (!resolved.ok()) return done(resolved.status());
      servable = *std::move(resolved);
    }
    InferenceResponse answer;
    answer.manifest = servable->model->shared_manifest();
    answer.model = model;
    answer.version = 1;
    answer.request_id = request_id;
    for (size_t i = 0; i < texts; ++i) {
      TextResult r;
      r.labels = labels_;
      answer.results.push_back(std::move(r));
    }
    done(std::move(answer));
  }
  const RequestLimits& limits() const override { return limits_; }
  const Env& env() const override { return *repository_->env(); }
  // Keeps each wait for a load on demand until FinishLoads().
  void WhenLoaded(const std::string& /*model*/, absl::Time /*deadline*/, ModelRepository::LoadedDone ready) override {
    MutexLock lock(&mu_);
    load_waits_.push_back(std::move(ready));
  }
  // Hands every waiting plan `loaded` (a version, or why there is none); how many waited.
  int FinishLoads(const absl::StatusOr<ServableHandle>& loaded) {
    std::vector<ModelRepository::LoadedDone> waits;
    {
      MutexLock lock(&mu_);
      waits.swap(load_waits_);
    }
    for (auto& ready : waits) ready(loaded);
    return static_cast<int>(waits.size());
  }

  // What the next calls get: an error, or one answer per text with `labels`; `hold` bytes asked
  // to be held for the answer.
  void FailWith(absl::Status error) { error_ = std::move(error); }
  void AnswerWith(std::vector<std::pair<std::string, float>> labels) { labels_ = std::move(labels); }
  void HoldOnSubmit(int64_t bytes) { hold_ = bytes; }
  // From now on Submit keeps each request unanswered until ReleaseHeld().
  void HoldAnswers() {
    MutexLock lock(&mu_);
    holding_ = true;
  }
  // Answers every request kept so far (the last first with `reverse`); how many.
  int ReleaseHeld(bool reverse = false) {
    std::vector<Done> waiting;
    {
      MutexLock lock(&mu_);
      waiting.swap(waiting_);
    }
    if (reverse) std::reverse(waiting.begin(), waiting.end());
    for (Done& done : waiting) Answer(std::move(done));
    return static_cast<int>(waiting.size());
  }
  int max_waiting() const {
    MutexLock lock(&mu_);
    return max_waiting_;
  }
  // Whether the last request's client has gone (its is_cancelled hook).
  bool last_cancelled() const {
    MutexLock lock(&mu_);
    return request_.is_cancelled && request_.is_cancelled();
  }

  int calls() const {
    MutexLock lock(&mu_);
    return calls_;
  }
  InferenceRequest request() const {
    MutexLock lock(&mu_);
    InferenceRequest copy;
    copy.model = request_.model;
    copy.version = request_.version;
    copy.texts = request_.texts;
    copy.request_id = request_.request_id;
    copy.deadline = request_.deadline;
    copy.options = request_.options;
    copy.span = request_.span;
    return copy;
  }
  Method method() const {
    MutexLock lock(&mu_);
    return method_;
  }
  bool had_servable() const {
    MutexLock lock(&mu_);
    return had_servable_;
  }
  absl::Status held() const {
    MutexLock lock(&mu_);
    return held_;
  }

 private:
  const ModelRepository* repository_;
  RequestLimits limits_;
  absl::Status error_;
  std::vector<std::pair<std::string, float>> labels_ = {{"positive", 0.75f}, {"negative", 0.25f}};
  int64_t hold_ = 0;
  mutable Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  Method method_ ABSL_GUARDED_BY(mu_) = Method::kClassify;
  bool had_servable_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status held_ ABSL_GUARDED_BY(mu_);
  InferenceRequest request_ ABSL_GUARDED_BY(mu_);
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Done> waiting_ ABSL_GUARDED_BY(mu_);
  int max_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ModelRepository::LoadedDone> load_waits_ ABSL_GUARDED_BY(mu_);
};

class FrontendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    store_ = new testing::TempStore("frontend_test");
    store_->CopyDemoFile("sentiment/1/model.pt", "sentiment/1/model.pt");
    auto repo = testing::PolledCpuRepository(store_->str());
    ASSERT_TRUE(repo.ok()) << repo.status();
    repo_ = repo->release();
    ASSERT_TRUE(repo_->Resolve("sentiment", 0).ok());
  }
  static void TearDownTestSuite() {
    delete repo_;
    delete store_;
  }

  // The four front ends over `core`, with these limits; gRPC on a port of its own.
  void Start(Calls::Options options = {}, int max_stream_inflight = kDefaultMaxStreamInflight) {
    calls_ = std::make_unique<Calls>(repo_, options);
    oip_api_ = std::make_unique<OipApi>(repo_, core_.limits(), calls_.get(), &ready_);
    native_ = std::make_unique<InferenceServiceImpl>(&core_, repo_, calls_.get(), max_stream_inflight);
    oip_ = std::make_unique<OipServiceImpl>(&core_, oip_api_.get(), calls_.get());
    http_ = std::make_unique<HttpApi>(&core_, repo_, calls_.get(), oip_api_.get(), &ready_, HttpApi::Options{});
    tei_ = std::make_unique<TeiGrpc>(
        TeiGrpc{&core_, calls_.get(), repo_, "", DefaultWireCaps(core_.limits()), max_stream_inflight});
    tei_predict_ = std::make_unique<TeiPredictService>(tei_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(native_.get());
    builder.RegisterService(oip_.get());
    builder.RegisterService(tei_predict_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    native_stub_ = v1::Inference::NewStub(channel);
    oip_stub_ = inference::GRPCInferenceService::NewStub(channel);
    tei_stub_ = tei::v1::Predict::NewStub(channel);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  grpc::Status Classify(const std::string& text, v1::ClassifyResponse* out, const std::string& request_id = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::ClassifyRequest in;
    in.mutable_model()->set_name("sentiment");
    in.add_texts(text);
    in.set_request_id(request_id);
    return native_stub_->Classify(&ctx, in, out);
  }
  grpc::Status ModelInfer(const std::string& text, inference::ModelInferResponse* out) {
    grpc::ClientContext ctx;
    inference::ModelInferRequest in;
    in.set_model_name("sentiment");
    auto* input = in.add_inputs();
    input->set_name("text");
    input->set_datatype("BYTES");
    input->add_shape(1);
    input->mutable_contents()->add_bytes_contents(text);
    return oip_stub_->ModelInfer(&ctx, in, out);
  }
  // One HTTP request through HttpApi, answered (synchronously, the fake core being synchronous).
  HttpResponse Http(const std::string& method, const std::string& target, const std::string& body,
                    std::vector<std::pair<std::string, std::string>> headers = {}) {
    HttpRequest request;
    request.method = method;
    request.target = target;
    request.body = body;
    request.peer = "ipv4:127.0.0.1:1";
    request.headers = std::move(headers);
    std::optional<HttpResponse> got;
    int answers = 0;
    http_->Handle(std::move(request), [&](HttpResponse r) {
      ++answers;
      got = std::move(r);
    });
    EXPECT_EQ(answers, 1);
    return got.value_or(HttpResponse{});
  }

  static std::string Header(const HttpResponse& r, const std::string& name) {
    for (const auto& [k, v] : r.headers) {
      if (k == name) return v;
    }
    return "";
  }

  static testing::TempStore* store_;
  static ModelRepository* repo_;
  FakeCore core_{repo_};
  std::atomic<bool> ready_{true};
  std::unique_ptr<Calls> calls_;
  std::unique_ptr<OipApi> oip_api_;
  std::unique_ptr<InferenceServiceImpl> native_;
  std::unique_ptr<OipServiceImpl> oip_;
  std::unique_ptr<HttpApi> http_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Inference::Stub> native_stub_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> oip_stub_;
  std::unique_ptr<TeiGrpc> tei_;
  std::unique_ptr<TeiPredictService> tei_predict_;
  std::unique_ptr<tei::v1::Predict::Stub> tei_stub_;
};

testing::TempStore* FrontendTest::store_ = nullptr;
ModelRepository* FrontendTest::repo_ = nullptr;

TEST_F(FrontendTest, EveryFrontEndHandsTheCoreThePreparedRequest) {
  Start();
  v1::ClassifyResponse answer;
  ASSERT_TRUE(Classify("a fine film", &answer).ok());
  InferenceRequest seen = core_.request();
  EXPECT_EQ(seen.model, "sentiment");
  EXPECT_EQ(seen.texts, std::vector<std::string>{"a fine film"});
  EXPECT_EQ(seen.request_id, "req-1");  // made up: the client sent none
  EXPECT_NE(seen.deadline, absl::InfiniteFuture());
  EXPECT_FALSE(core_.had_servable());
  ASSERT_EQ(answer.results_size(), 1);
  EXPECT_EQ(answer.results(0).labels(0).label(), "positive");
  EXPECT_FLOAT_EQ(answer.results(0).labels(0).score(), 0.75f);

  // HTTP: the id from X-Request-Id, echoed; the deadline from X-Request-Timeout-Ms.
  HttpResponse r = Http("POST", "/v1/models/sentiment:tag", R"({"texts": ["Paris"]})",
                        {{"X-Request-Id", "http-7"}, {"X-Request-Timeout-Ms", "5000"}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(core_.method(), Method::kTag);
  EXPECT_EQ(core_.request().request_id, "http-7");
  EXPECT_EQ(Header(r, "X-Request-Id"), "http-7");
  EXPECT_LE(core_.request().deadline, core_.env().Now() + absl::Seconds(5));

  // OIP over gRPC and KServe REST: planned against the version's manifest, which the core answers from.
  inference::ModelInferResponse oip_answer;
  ASSERT_TRUE(ModelInfer("a dull film", &oip_answer).ok());
  EXPECT_EQ(core_.request().texts, std::vector<std::string>{"a dull film"});
  EXPECT_TRUE(core_.had_servable());
  EXPECT_EQ(core_.request().request_id, "req-2");  // OIP makes its id up as it reads the request
  r = Http("POST", "/v2/models/sentiment/infer",
           R"({"id": "rest-1", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["ok"]}]})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(core_.request().request_id, "rest-1");
  EXPECT_EQ(nlohmann::json::parse(r.body)["id"], "rest-1");
  EXPECT_EQ(core_.calls(), 4);
}

TEST_F(FrontendTest, TheCoresErrorIsEveryProtocolsErrorWithTheSameMessage) {
  Start();
  core_.FailWith(absl::InvalidArgumentError("texts[0]: too long for this test"));
  v1::ClassifyResponse answer;
  grpc::Status s = Classify("x", &answer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "texts[0]: too long for this test");
  inference::ModelInferResponse oip_answer;
  s = ModelInfer("x", &oip_answer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "texts[0]: too long for this test");
  HttpResponse r = Http("POST", "/v1/models/sentiment:classify", R"({"texts": ["x"]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(nlohmann::json::parse(r.body)["error"], "texts[0]: too long for this test");
  core_.FailWith(absl::UnavailableError("version 1 is unloading"));
  r = Http("POST", "/v2/models/sentiment/infer",
           R"({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["ok"]}]})");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(nlohmann::json::parse(r.body)["error"], "version 1 is unloading");
}

TEST_F(FrontendTest, AnAnswerOverTheSendLimitIsRefusedWithOneMessageEverywhere) {
  Calls::Options options;
  options.max_response_bytes = 40;
  Start(options);
  core_.AnswerWith({{std::string(100, 'x'), 1.0f}});
  const std::string message = "over the limit of 40 bytes (--max-message-bytes); ask for fewer texts or outputs";
  v1::ClassifyResponse answer;
  grpc::Status s = Classify("x", &answer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find(message), std::string::npos) << s.error_message();
  HttpResponse r = Http("POST", "/v1/models/sentiment:classify", R"({"texts": ["x"]})");
  EXPECT_EQ(r.status, 429);
  EXPECT_NE(r.body.find(message), std::string::npos) << r.body;
  inference::ModelInferResponse oip_answer;
  s = ModelInfer("x", &oip_answer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find(message), std::string::npos) << s.error_message();
  r = Http("POST", "/v2/models/sentiment/infer",
           R"({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["ok"]}]})");
  EXPECT_EQ(r.status, 429);
  EXPECT_NE(r.body.find(message), std::string::npos) << r.body;
}

TEST_F(FrontendTest, BytesInFlightAreAdmittedOnceAndReleasedByTheAnswer) {
  Calls::Options options;
  options.max_inflight_request_bytes = 4;  // fewer than any request's bytes: refused before decoding
  Start(options);
  v1::ClassifyResponse answer;
  grpc::Status s = Classify("a fine film", &answer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("--max-inflight-request-bytes"), std::string::npos) << s.error_message();
  HttpResponse r = Http("POST", "/v1/models/sentiment:classify", R"({"texts": ["x"]})");
  EXPECT_EQ(r.status, 429) << r.body;
  inference::ModelInferResponse oip_answer;
  EXPECT_EQ(ModelInfer("x", &oip_answer).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(core_.calls(), 0);

  // With room for the requests, an answer's estimate is held too, and refused when over; the bytes
  // of an answered call no longer count (the next call is admitted).
  TearDown();
  options.max_inflight_request_bytes = 1000;
  Start(options);
  core_.HoldOnSubmit(5000);
  ASSERT_TRUE(Classify("a fine film", &answer).ok());
  EXPECT_EQ(core_.held().code(), absl::StatusCode::kResourceExhausted);
  core_.HoldOnSubmit(100);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(Classify("a fine film", &answer).ok());
    ASSERT_TRUE(core_.held().ok()) << core_.held();
    EXPECT_EQ(Http("POST", "/v1/models/sentiment:classify", R"({"texts": ["x"]})").status, 200);
    ASSERT_TRUE(core_.held().ok()) << core_.held();
  }
}

TEST_F(FrontendTest, RequestIdsAreTheClientsOrMadeUpOnceAcrossProtocols) {
  Start();
  v1::ClassifyResponse answer;
  ASSERT_TRUE(Classify("x", &answer, "mine").ok());
  EXPECT_EQ(core_.request().request_id, "mine");
  EXPECT_EQ(answer.request_id(), "mine");
  HttpResponse r = Http("POST", "/v1/models/sentiment:classify", R"({"texts": ["x"]})");
  EXPECT_EQ(Header(r, "X-Request-Id"), "req-1");  // the one counter of every protocol
  ASSERT_TRUE(Classify("x", &answer).ok());
  EXPECT_EQ(answer.request_id(), "req-2");
  // A malformed timeout header is refused, naming it, after the id is known (so it is echoed).
  r = Http("POST", "/v1/models/sentiment:classify", R"({"texts": ["x"]})", {{"X-Request-Timeout-Ms", "soon"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("X-Request-Timeout-Ms"), std::string::npos) << r.body;
  EXPECT_EQ(Header(r, "X-Request-Id"), "req-3");
}

// Polls `done` until it holds, for at most 30 s (what a stream's reactor does happens on gRPC's threads).
template <typename Predicate>
bool Eventually(Predicate done) {
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

v1::ClassifyRequest StreamRequest(const std::string& model, const std::string& text, const std::string& id) {
  v1::ClassifyRequest r;
  r.mutable_model()->set_name(model);
  r.add_texts(text);
  r.set_request_id(id);
  return r;
}

TEST_F(FrontendTest, AStreamAnswersEachRequestWithItsIndexAndIdAndGoesOnAfterAnError) {
  Start();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = native_stub_->ClassifyStream(&ctx);
  ASSERT_TRUE(stream->Write(StreamRequest("sentiment", "a fine film", "one")));
  ASSERT_TRUE(stream->Write(StreamRequest("nope", "x", "two")));  // the core answers NOT_FOUND
  ASSERT_TRUE(stream->Write(StreamRequest("sentiment", "a dull film", "")));
  ASSERT_TRUE(stream->WritesDone());
  std::map<int64_t, v1::ClassifyStreamResponse> answers;
  v1::ClassifyStreamResponse answer;
  while (stream->Read(&answer)) EXPECT_TRUE(answers.emplace(answer.index(), answer).second) << answer.index();
  grpc::Status s = stream->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].request_id(), "one");
  ASSERT_TRUE(answers[0].has_response());
  EXPECT_EQ(answers[0].response().request_id(), "one");
  EXPECT_EQ(answers[0].response().results(0).labels(0).label(), "positive");
  EXPECT_EQ(answers[1].request_id(), "two");
  ASSERT_TRUE(answers[1].has_error());
  EXPECT_EQ(answers[1].error().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(answers[1].error().message().find("nope"), std::string::npos) << answers[1].error().message();
  EXPECT_TRUE(answers[2].has_response());
  EXPECT_EQ(answers[2].request_id(), "req-1");  // made up, as a unary call's
  EXPECT_EQ(core_.request().texts, std::vector<std::string>{"a dull film"});
  EXPECT_NE(core_.request().deadline, absl::InfiniteFuture()) << "the stream's deadline is each request's";
  EXPECT_EQ(core_.calls(), 3);
}

TEST_F(FrontendTest, AStreamReadsNoMoreRequestsThanItsInflightLimitAheadOfTheirAnswers) {
  Start({}, /*max_stream_inflight=*/2);
  core_.HoldAnswers();
  grpc::ClientContext ctx;
  auto stream = native_stub_->ClassifyStream(&ctx);
  constexpr int kRequests = 6;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(stream->Write(StreamRequest("sentiment", "x", "")));
  ASSERT_TRUE(stream->WritesDone());
  ASSERT_TRUE(Eventually([&] { return core_.calls() == 2; }));
  // Every request was written by the client, but only two were read: the rest wait for answers.
  int read = 0;
  v1::ClassifyStreamResponse answer;
  while (read < kRequests) {
    ASSERT_TRUE(Eventually([&] { return core_.calls() > read; }));
    const int released = core_.ReleaseHeld();
    for (int i = 0; i < released; ++i) {
      ASSERT_TRUE(stream->Read(&answer));
      EXPECT_TRUE(answer.has_response());
      ++read;
    }
  }
  EXPECT_FALSE(stream->Read(&answer));
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(core_.calls(), kRequests);
  EXPECT_EQ(core_.max_waiting(), 2) << "more requests were read than --max-stream-inflight";
}

TEST_F(FrontendTest, ACancelledStreamCancelsTheRequestsItHasInTheCore) {
  Start();
  core_.HoldAnswers();
  grpc::ClientContext ctx;
  auto stream = native_stub_->ClassifyStream(&ctx);
  ASSERT_TRUE(stream->Write(StreamRequest("sentiment", "x", "")));
  ASSERT_TRUE(stream->Write(StreamRequest("sentiment", "y", "")));
  ASSERT_TRUE(Eventually([&] { return core_.calls() == 2; }));
  EXPECT_FALSE(core_.last_cancelled());
  ctx.TryCancel();
  ASSERT_TRUE(Eventually([&] { return core_.last_cancelled(); }));
  // The core answers what it holds after the client went: nothing is written, nothing is lost (the
  // stream ends once both are retired; the server's shutdown below would hang or ASan would report
  // otherwise).
  EXPECT_EQ(core_.ReleaseHeld(), 2);
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

tei::v1::PredictRequest TeiRequest(const std::string& text) {
  tei::v1::PredictRequest r;
  r.set_inputs(text);
  r.set_truncate(true);
  return r;
}

TEST_F(FrontendTest, TeisStreamAnswersInTheOrderOfItsRequestsWhateverOrderTheCoreAnswersIn) {
  Start();
  core_.HoldAnswers();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = tei_stub_->PredictStream(&ctx);
  // Each answer's compute_chars tells whose it is: 1, 2, 3 characters.
  for (const char* text : {"a", "bb", "ccc"}) ASSERT_TRUE(stream->Write(TeiRequest(text)));
  ASSERT_TRUE(stream->WritesDone());
  ASSERT_TRUE(Eventually([&] { return core_.calls() == 3; }));
  EXPECT_EQ(core_.ReleaseHeld(/*reverse=*/true), 3);
  tei::v1::PredictResponse answer;
  std::vector<uint32_t> order;
  while (stream->Read(&answer)) {
    order.push_back(answer.metadata().compute_chars());
    EXPECT_EQ(answer.predictions(0).label(), "positive");
  }
  EXPECT_EQ(order, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(FrontendTest, TeisStreamEndsWithTheFirstFailingRequestsStatusAndDropsWhatCameAfter) {
  Start();
  core_.HoldAnswers();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = tei_stub_->PredictStream(&ctx);
  // The empty text is refused at once, before the first is answered; the third is answered before the first.
  for (const char* text : {"a", "", "ccc"}) ASSERT_TRUE(stream->Write(TeiRequest(text)));
  ASSERT_TRUE(Eventually([&] { return core_.calls() == 2; }));
  EXPECT_EQ(core_.ReleaseHeld(/*reverse=*/true), 2);
  tei::v1::PredictResponse answer;
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_EQ(answer.metadata().compute_chars(), 1u);
  EXPECT_FALSE(stream->Read(&answer)) << "an answer after the failing request was written";
  const grpc::Status s = stream->Finish();  // the client never half-closed: the server ended the stream
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("`inputs` cannot be empty"), std::string::npos) << s.error_message();
}

// Keeps every span it is given.
class RecordingSink final : public SpanSink {
 public:
  void Export(Span span) override {
    MutexLock lock(&mu_);
    spans_.push_back(std::move(span));
  }
  std::vector<Span> spans() {
    MutexLock lock(&mu_);
    return spans_;
  }
  // The spans without a parent in this process: the calls' own.
  std::vector<Span> calls() {
    std::vector<Span> out;
    for (Span& s : spans()) {
      if (s.kind == Span::Kind::kServer) out.push_back(std::move(s));
    }
    return out;
  }

 private:
  Mutex mu_;
  std::vector<Span> spans_ ABSL_GUARDED_BY(mu_);
};

TEST_F(FrontendTest, AnExportedCallIsASpanUnderTheCallersTraceparentOnEveryProtocol) {
  RecordingSink sink;
  Calls::Options options;
  options.spans = &sink;
  options.span_ratio = 0;  // only calls whose traceparent says sampled
  Start(options);
  const std::string traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  grpc::ClientContext ctx;
  ctx.AddMetadata("traceparent", traceparent);
  v1::ClassifyRequest in = StreamRequest("sentiment", "a fine film", "traced");
  v1::ClassifyResponse out;
  ASSERT_TRUE(native_stub_->Classify(&ctx, in, &out).ok());
  // A call is recorded (and its spans made) once gRPC is done with it, after the client's answer.
  ASSERT_TRUE(Eventually([&] { return sink.calls().size() == 1; }));
  const Span call = sink.calls()[0];
  EXPECT_EQ(call.name, "Classify");
  EXPECT_EQ(ToHex(call.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
  ASSERT_TRUE(call.parent.has_value());
  EXPECT_EQ(ToHex(*call.parent), "00f067aa0ba902b7");
  EXPECT_EQ(call.status, Span::Status::kUnset);
  EXPECT_LE(call.start, call.end);
  std::map<std::string, Span::Value> attributes(call.attributes.begin(), call.attributes.end());
  EXPECT_EQ(std::get<std::string>(attributes["qvi.model"]), "sentiment");
  EXPECT_EQ(std::get<std::string>(attributes["qvi.request_id"]), "traced");
  EXPECT_EQ(std::get<int64_t>(attributes["qvi.texts"]), 1);
  EXPECT_EQ(std::get<int64_t>(attributes["rpc.grpc.status_code"]), 0);
  EXPECT_GT(std::get<int64_t>(attributes["qvi.answer_bytes"]), 0);
  ASSERT_TRUE(core_.request().span.has_value()) << "the core is handed the span its batches link to";
  EXPECT_EQ(core_.request().span->span_id, call.span_id);
  for (const Span& s : sink.spans()) {
    if (s.kind == Span::Kind::kServer) continue;
    EXPECT_EQ(s.trace_id, call.trace_id) << s.name;
    EXPECT_EQ(s.parent, std::optional<SpanId>(call.span_id)) << s.name;
  }

  // Not sampled: no traceparent at a ratio of 0, or a traceparent that says not sampled.
  ASSERT_TRUE(Classify("untraced", &out).ok());
  grpc::ClientContext unsampled;
  unsampled.AddMetadata("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  ASSERT_TRUE(native_stub_->Classify(&unsampled, in, &out).ok());
  EXPECT_FALSE(core_.request().span.has_value());
  // HTTP and a refused call: a span each, the refusal's with its error.
  core_.FailWith(absl::NotFoundError("no such model"));
  HttpResponse r = Http("POST", "/v1/models/sentiment:classify", R"({"texts": ["x"]})", {{"traceparent", traceparent}});
  EXPECT_EQ(r.status, 404);
  ASSERT_TRUE(Eventually([&] { return sink.calls().size() == 2; }));
  const Span refused = sink.calls()[1];
  EXPECT_EQ(ToHex(refused.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(refused.status, Span::Status::kError);
  EXPECT_NE(refused.status_message.find("NOT_FOUND: no such model"), std::string::npos) << refused.status_message;
}

// The steps of a call whose model loads on demand, as a transport writes them (infer_steps.h): the first
// plan finds the model loading, the second (once the load handed it over) plans one text.
struct OnDemandSteps {
  Call* c;
  int* plans;
  absl::Status* answered;
  Call& call() { return *c; }
  absl::Time WaitDeadline() { return absl::InfiniteFuture(); }
  absl::StatusOr<Planned> Plan() {
    if ((*plans)++ == 0) return Catalog::LoadsOnDemand("sentiment");
    Planned planned;
    planned.request.model = "sentiment";
    planned.request.texts = {"a fine film"};
    return planned;
  }
  absl::Status Prepare(InferenceRequest& r, absl::Duration timeout) {
    return c->Prepare(r, "", absl::InfiniteFuture(), timeout);
  }
  void Fail(const absl::Status& status) {
    if (!c->Claim()) return;
    *answered = status;
    c->Record(status, nullptr);
  }
  Core::Done Answerer(Planned&&) {
    return [c = c, answered = answered](absl::StatusOr<InferenceResponse> answer) {
      if (!c->Claim()) return;
      AnswerSummary summary;
      *answered = answer.ok() ? c->BuildAnswer(
                                    *answer, [] { return int64_t{1}; }, &summary)
                              : answer.status();
      c->Record(*answered, answered->ok() ? &summary : nullptr);
    };
  }
};

TEST_F(FrontendTest, ACallThatWaitedForALoadOnDemandShowsTheWaitInItsTrace) {
  RecordingSink sink;
  Calls::Options options;
  options.spans = &sink;
  Start(options);
  const std::string traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  int plans = 0;
  absl::Status answered = absl::UnknownError("not answered");
  {
    Call call(calls_.get(), "Classify", 16);
    call.SetOrigin("ipv4:127.0.0.1:1", traceparent);
    PlanAndSubmit(&core_, OnDemandSteps{&call, &plans, &answered});
    EXPECT_EQ(plans, 1);
    EXPECT_EQ(core_.calls(), 0) << "nothing is submitted while the model loads";
    EXPECT_TRUE(sink.spans().empty());
    absl::StatusOr<ServableHandle> loaded = repo_->Resolve("sentiment", 0);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(core_.FinishLoads(*loaded), 1);
  }
  EXPECT_EQ(plans, 2);
  EXPECT_TRUE(answered.ok()) << answered;
  EXPECT_EQ(core_.calls(), 1);
  ASSERT_EQ(sink.calls().size(), 1u);
  const Span call = sink.calls()[0];
  std::vector<Span> waits;
  for (const Span& s : sink.spans()) {
    if (s.name == "qvi.load_wait") waits.push_back(s);
  }
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(waits[0].trace_id, call.trace_id);
  EXPECT_EQ(waits[0].parent, std::optional<SpanId>(call.span_id));
  EXPECT_LE(call.start, waits[0].start);
  EXPECT_LE(waits[0].start, waits[0].end);
  EXPECT_LE(waits[0].end, call.end);

  // A wait that ends without a load is the call's error, and the wait is in its trace too.
  Call refused(calls_.get(), "Classify", 16);
  refused.SetOrigin("ipv4:127.0.0.1:1", traceparent);
  plans = 0;
  PlanAndSubmit(&core_, OnDemandSteps{&refused, &plans, &answered});
  EXPECT_EQ(core_.FinishLoads(absl::DeadlineExceededError("the load did not finish in time")), 1);
  EXPECT_EQ(answered.code(), absl::StatusCode::kDeadlineExceeded) << answered;
  EXPECT_EQ(plans, 1);
  ASSERT_EQ(sink.calls().size(), 2u);
  const std::optional<SpanId> refused_span = sink.calls()[1].span_id;
  EXPECT_EQ(sink.calls()[1].status, Span::Status::kError);
  int refused_waits = 0;
  for (const Span& s : sink.spans()) refused_waits += s.name == "qvi.load_wait" && s.parent == refused_span;
  EXPECT_EQ(refused_waits, 1);

  // A call that did not wait has no such span.
  grpc::ClientContext ctx;
  ctx.AddMetadata("traceparent", traceparent);
  v1::ClassifyResponse out;
  ASSERT_TRUE(native_stub_->Classify(&ctx, StreamRequest("sentiment", "a fine film", "plain"), &out).ok());
  ASSERT_TRUE(Eventually([&] { return sink.calls().size() == 3; }));
  int all_waits = 0;
  for (const Span& s : sink.spans()) all_waits += s.name == "qvi.load_wait";
  EXPECT_EQ(all_waits, 2);
}

TEST(ExplainLabelTest, TheExplanationsAskedForNameTheMetricsSeriesInOneOrder) {
  OutputOptions options;
  EXPECT_EQ(ExplainLabel(options), "none");
  options.Ask(OutputSwitch::kGates);
  options.Ask(OutputSwitch::kAttention);
  EXPECT_EQ(ExplainLabel(options), "attention+gates") << "the catalogue's order, whatever the asking order";
  options.Ask(OutputSwitch::kOcclusion);
  options.Ask(OutputSwitch::kLayerAttention);
  EXPECT_EQ(ExplainLabel(options), "attention+gates+layer_attention+occlusion");
}

}  // namespace
}  // namespace qvi

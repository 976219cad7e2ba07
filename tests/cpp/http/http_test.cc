// The HTTP port's routing, its status mapping, and the server itself with a handler of the test's:
// answers from another thread, keep-alive, and a shutdown that lets a request in flight finish.
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <functional>
#include <future>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "nlohmann/json.hpp"

#include <google/protobuf/util/json_util.h>
#include "qvi/serving/v1/inference.pb.h"
#include "server/http/explain_page.h"
#include "server/http/hf/pipeline_routes.h"
#include "server/http/http_api.h"
#include "server/http/http_server.h"
#include "server/http/native/json_body.h"
#include "server/http/native/proto_json.h"
#include "server/http/openai/classify_routes.h"
#include "server/http/openapi.h"
#include "server/http/routes.h"
#include "server/http/tei/tei_routes.h"
#include "server/http/tei/tokenize_routes.h"

namespace qvi {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

TEST(HttpRouteTest, PathsAndMethodsPickTheRoute) {
  using Kind = HttpRoute::Kind;
  struct Case {
    const char* method;
    const char* target;
    Kind kind;
    const char* model;
    int64_t version;
  };
  for (const Case& c : std::vector<Case>{
           {"GET", "/v2/health/live", Kind::kLive, "", 0},
           {"GET", "/v2/health/ready?verbose=1", Kind::kReady, "", 0},
           {"GET", "/v1/models", Kind::kListModels, "", 0},
           {"GET", "/v1/models/sentiment", Kind::kGetModel, "sentiment", 0},
           {"GET", "/v1/models/sentiment/versions/3", Kind::kGetModel, "sentiment", 3},
           {"POST", "/v1/models/sentiment:classify", Kind::kClassify, "sentiment", 0},
           {"POST", "/v1/models/ner/versions/12:tag", Kind::kTag, "ner", 12},
           {"GET", "/v2", Kind::kServerMetadata, "", 0},
           {"GET", "/v2/models/sentiment", Kind::kModelMetadata, "sentiment", 0},
           {"GET", "/v2/models/sentiment/versions/2", Kind::kModelMetadata, "sentiment", 2},
           {"GET", "/v2/models/sentiment/ready", Kind::kModelReady, "sentiment", 0},
           {"GET", "/v2/models/sentiment/versions/2/ready", Kind::kModelReady, "sentiment", 2},
           {"POST", "/v2/models/sentiment/infer", Kind::kInfer, "sentiment", 0},
           {"POST", "/v2/models/ner/versions/1/infer", Kind::kInfer, "ner", 1},
           {"GET", "/", Kind::kPage, "", 0},
           {"GET", "/?model=ner", Kind::kPage, "", 0},
           {"POST", "/", Kind::kTeiPredict, "", 0},  // TEI's / for a classifier
           {"POST", "/predict", Kind::kTeiPredict, "", 0},
           {"GET", "/info", Kind::kTeiInfo, "", 0},
           {"POST", "/models/topics", Kind::kTeiPredict, "topics", 0},
           {"POST", "/models/topics/predict", Kind::kTeiPredict, "topics", 0},
           {"GET", "/models/topics/info", Kind::kTeiInfo, "topics", 0},
           {"POST", "/tokenize", Kind::kTeiTokenize, "", 0},
           {"POST", "/models/ner/tokenize", Kind::kTeiTokenize, "ner", 0},
           {"POST", "/decode", Kind::kTeiDecode, "", 0},
           {"POST", "/models/ner/decode", Kind::kTeiDecode, "ner", 0},
           {"POST", "/classify", Kind::kOpenAiClassify, "", 0},
           {"POST", "/v1/classify", Kind::kOpenAiClassify, "", 0},
       }) {
    absl::StatusOr<HttpRoute> r = ParseRoute(c.method, c.target);
    ASSERT_TRUE(r.ok()) << c.target << ": " << r.status();
    EXPECT_EQ(r->kind, c.kind) << c.target;
    EXPECT_EQ(r->model, c.model) << c.target;
    EXPECT_EQ(r->version, c.version) << c.target;
    // TEI answers / and /models/{m} by what the model is (a tagger: token classification); /predict classifies.
    const std::string target = c.target;
    EXPECT_EQ(r->by_model_type, c.kind == Kind::kTeiPredict && target.find("predict") == std::string::npos) << c.target;
  }
}

TEST(HttpRouteTest, RefusalsSayWhy) {
  struct Case {
    const char* method;
    const char* target;
    absl::StatusCode code;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"GET", "/index.html", absl::StatusCode::kNotFound, "no route for /index.html"},
           {"PUT", "/", absl::StatusCode::kFailedPrecondition,
            "method PUT is not allowed on /; use GET (the page) or POST (TEI's predict)"},
           {"GET", "/predict", absl::StatusCode::kFailedPrecondition,
            "method GET is not allowed on /predict; use POST"},
           {"POST", "/info", absl::StatusCode::kFailedPrecondition, "use GET"},
           {"POST", "/models/", absl::StatusCode::kNotFound, "no route for /models/"},
           {"POST", "/models/a/embed", absl::StatusCode::kNotFound,
            "TEI's routes for a model are /models/{m}/predict, /models/{m}/info, /models/{m}/tokenize"},
           {"GET", "/v1/models/", absl::StatusCode::kNotFound, "no route for /v1/models/"},
           {"GET", "/v1/models/a/b", absl::StatusCode::kNotFound, "no route"},
           {"POST", "/v1/models/a:predict", absl::StatusCode::kNotFound, "the verbs are :classify and :tag"},
           {"GET", "/v1/models/a:classify", absl::StatusCode::kFailedPrecondition,
            "method GET is not allowed on /v1/models/a:classify; use POST"},
           {"POST", "/v2/health/live", absl::StatusCode::kFailedPrecondition, "use GET"},
           {"POST", "/v1/models/a/versions/0:tag", absl::StatusCode::kInvalidArgument,
            "version: '0' is not a positive integer"},
           {"POST", "/v1/models/a/versions/-1:tag", absl::StatusCode::kInvalidArgument, "not a positive integer"},
           {"GET", "/v2/models/a/infer", absl::StatusCode::kFailedPrecondition, "use POST"},
           {"POST", "/v2/models/a/ready", absl::StatusCode::kFailedPrecondition, "use GET"},
           {"POST", "/v2/models/a/predict", absl::StatusCode::kNotFound, "no route"},
           {"GET", "/v2/models/a/versions/x", absl::StatusCode::kInvalidArgument, "'x' is not a positive integer"},
       }) {
    absl::StatusOr<HttpRoute> r = ParseRoute(c.method, c.target);
    ASSERT_FALSE(r.ok()) << c.target;
    EXPECT_EQ(r.status().code(), c.code) << c.target << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status();
  }
}

// TEI's predict body (tei_routes.h): a text, a list of one, or a batch of such lists; what TEI's callers and
// InferenceClient send is read, and what these models cannot answer is refused naming the field.
TEST(TeiRoutesTest, PredictBodiesAreReadAsTeiReadsThem) {
  absl::StatusOr<TeiPredict> p = ParseTeiPredict(R"({"inputs": "a good film"})", 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->texts, std::vector<std::string>{"a good film"});
  EXPECT_FALSE(p->batch || p->nested || p->refuse_truncation);
  p = ParseTeiPredict(R"({"inputs": ["a good film"], "truncate": false, "raw_scores": false})", 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(!p->batch && p->refuse_truncation);
  p = ParseTeiPredict(R"({"inputs": [["a"], ["b"]], "truncation_direction": "Right"})", 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->texts, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(p->batch);
  p = ParseTeiPredict(R"({"inputs": "a", "parameters": {"top_k": 2, "function_to_apply": "softmax"}})", 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->nested);
  EXPECT_EQ(p->top_k, 2);
  struct Case {
    const char* body;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {R"([1])", "the body is not a JSON object"},
           {R"({"input": "a"})", "inputs: missing"},
           {R"({"inputs": 3})", "inputs: a text, a list of one text, or a list of such lists"},
           {R"({"inputs": ""})", "Input validation error: `inputs` cannot be empty"},
           {R"({"inputs": []})", "Input validation error: `inputs` cannot be empty"},
           {R"({"inputs": ["q", "d"]})", "inputs: a pair of texts; these models classify one text"},
           {R"({"inputs": ["a", "b", "c"]})", "inputs: a list of 3 items; give one text"},
           {R"({"inputs": [["a"], "b"]})", "inputs[1]: a batch holds lists of one text"},
           {R"({"inputs": [["a"], [2]]})", "inputs[1][0]: not a text"},
           {R"({"inputs": [["a"], ["b"], ["c"], ["d"], ["e"]]})", "batch size 5 > maximum allowed batch size 4"},
           {R"({"inputs": "a", "raw_scores": true})", "raw_scores: the models' logits are not answered here"},
           {R"({"inputs": "a", "truncate": "no"})", "truncate: not true or false"},
           {R"({"inputs": "a", "truncation_direction": "left"})", "truncation_direction: only \"right\""},
           {R"({"inputs": "a", "parameters": {"top_k": 0}})", "parameters.top_k: not a whole number"},
           {R"({"inputs": "a", "parameters": {"function_to_apply": "sigmoid"}})",
            "parameters.function_to_apply: only \"softmax\""},
       }) {
    absl::StatusOr<TeiPredict> bad = ParseTeiPredict(c.body, 4);
    ASSERT_FALSE(bad.ok()) << c.body;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_NE(bad.status().message().find(c.message), std::string::npos) << c.body << ": " << bad.status();
  }
}

// TEI's error body and status codes: Validation 422, Empty 400, Overloaded 429, Unhealthy 503, Backend else;
// the headers of the native error kept.
TEST(TeiRoutesTest, ErrorsTakeTeisShapeAndStatus) {
  struct Case {
    absl::Status status;
    int http;
    const char* type;
  };
  for (const Case& c : std::vector<Case>{
           {absl::InvalidArgumentError("texts[0]: 600 tokens exceed"), 422, "Validation"},
           {absl::InvalidArgumentError("Input validation error: `inputs` cannot be empty"), 400, "Empty"},
           {absl::ResourceExhaustedError("the queue is full"), 429, "Overloaded"},
           {absl::UnavailableError("draining"), 503, "Unhealthy"},
           {absl::NotFoundError("model 'x' is not in the store"), 404, "Validation"},
           {absl::InternalError("the forward pass failed"), 500, "Backend"},
           {absl::UnauthenticatedError("an API key is needed"), 401, "Backend"},
       }) {
    const HttpResponse r = TeiError(c.status);
    EXPECT_EQ(r.status, c.http) << c.status;
    const nlohmann::json body = nlohmann::json::parse(r.body);
    EXPECT_EQ(body, (nlohmann::json{{"error", std::string(c.status.message())}, {"error_type", c.type}}));
  }
  const HttpResponse unauthenticated = TeiError(absl::UnauthenticatedError("an API key is needed"));
  EXPECT_EQ(unauthenticated.headers,
            (std::vector<std::pair<std::string, std::string>>{{"WWW-Authenticate", "Bearer"}}));
}

// TEI's /tokenize and /decode bodies (tei/tokenize_routes.h): a text or a list; a list of ids or a list of such
// lists; TEI's defaults (special tokens added, skipped when decoding); refusals name the field.
TEST(TeiRoutesTest, TokenizeAndDecodeBodiesAreReadAsTeiReadsThem) {
  absl::StatusOr<TeiTokenize> t = ParseTeiTokenize(R"({"inputs": "a good film"})", 4, 64);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->texts, std::vector<std::string>{"a good film"});
  EXPECT_TRUE(t->add_special_tokens);
  t = ParseTeiTokenize(R"({"inputs": ["a", "b"], "add_special_tokens": false, "prompt_name": null})", 4, 64);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->texts, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(t->add_special_tokens);
  absl::StatusOr<TeiDecode> d = ParseTeiDecode(R"({"ids": [101, 7592, 102]})", 4);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->ids, (std::vector<std::vector<int64_t>>{{101, 7592, 102}}));
  EXPECT_TRUE(d->skip_special_tokens);
  d = ParseTeiDecode(R"({"ids": [[1], [2, 3]], "skip_special_tokens": false})", 4);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->ids, (std::vector<std::vector<int64_t>>{{1}, {2, 3}}));
  EXPECT_FALSE(d->skip_special_tokens);
  for (const auto& [body, message] : std::vector<std::pair<std::string, const char*>>{
           {R"({"inputs": ""})", "Input validation error: `inputs` cannot be empty"},
           {R"({"inputs": []})", "Input validation error: `inputs` cannot be empty"},
           {R"({"inputs": ["a", ["b"]]})", "inputs[1]: not a text"},
           {R"({"inputs": ["a", "b", "c", "d", "e"]})", "batch size 5 > maximum allowed batch size 4"},
           {R"({"inputs": ")" + std::string(65, 'x') + R"("})", "inputs: 65 bytes, over the limit of 64"},
           {R"({"inputs": "a", "add_special_tokens": 1})", "add_special_tokens: not true or false"},
           {R"({"inputs": "a", "prompt_name": "query"})", "prompt_name: these models have no prompts"},
           {R"({"text": "a"})", "inputs: missing"},
       }) {
    absl::StatusOr<TeiTokenize> bad = ParseTeiTokenize(body, 4, 64);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_NE(bad.status().message().find(message), std::string::npos) << body << ": " << bad.status();
  }
  for (const auto& [body, message] : std::vector<std::pair<std::string, const char*>>{
           {R"({"ids": []})", "Input validation error: `input_ids` cannot be empty"},
           {R"({"ids": [[]]})", "Input validation error: `input_ids` cannot be empty"},
           {R"({"ids": [1, -2]})", "ids[1]: not a token id"},
           {R"({"ids": [1, 2.5]})", "ids[1]: not a token id"},
           {R"({"ids": [[1], 2]})", "ids[1]: not a list of token ids"},
           {R"({"ids": [[1], [2], [3], [4], [5]]})", "batch size 5 > maximum allowed batch size 4"},
           {R"({"ids": "101"})", "ids: a list of token ids"},
           {R"({"ids": [1], "skip_special_tokens": "yes"})", "skip_special_tokens: not true or false"},
       }) {
    absl::StatusOr<TeiDecode> bad = ParseTeiDecode(body, 4);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_NE(bad.status().message().find(message), std::string::npos) << body << ": " << bad.status();
  }
  // An empty list of ids is TEI's "Empty" (400), as an empty text is.
  EXPECT_EQ(TeiError(ParseTeiDecode(R"({"ids": []})", 4).status()).status, 400);
}

// Hugging Face's token-classification body (hf/pipeline_routes.h): what the pipeline's aggregations mean here
// is read ("simple", "first": the tagger's entities), what needs sub-word scores is refused naming the field.
TEST(TeiRoutesTest, TokenClassificationBodiesAreReadAsThePipelineReadsThem) {
  absl::StatusOr<TokenClassification> t = ParseTokenClassification(
      R"({"inputs": "Anna lives in Paris", "parameters": {"aggregation_strategy": "simple", "ignore_labels": ["O", "LOC"]}})",
      4);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->texts, std::vector<std::string>{"Anna lives in Paris"});
  EXPECT_FALSE(t->batch);
  EXPECT_EQ(t->ignore, (std::vector<std::string>{"O", "LOC"}));
  t = ParseTokenClassification(R"({"inputs": ["a", "b"], "parameters": {"aggregation_strategy": "first"}})", 4);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->batch);
  for (const auto& [body, message] : std::vector<std::pair<const char*, const char*>>{
           {R"({"inputs": "a", "parameters": {"aggregation_strategy": "average"}})",
            "parameters.aggregation_strategy: \"simple\" or \"first\""},
           {R"({"inputs": "a", "parameters": {"stride": 8}})", "parameters.stride: not read here"},
           {R"({"inputs": "a", "parameters": {"ignore_labels": [1]}})", "parameters.ignore_labels[0]: not a label"},
           {R"({"inputs": "a", "parameters": []})", "parameters: not an object"},
           {R"({"inputs": ["a", "b", "c", "d", "e"]})", "batch size 5"},
           {R"({"inputs": [""]})", "cannot be empty"},
           {R"({"inputs": 3})", "inputs: a text or a list of texts"},
       }) {
    absl::StatusOr<TokenClassification> bad = ParseTokenClassification(body, 4);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_NE(bad.status().message().find(message), std::string::npos) << body << ": " << bad.status();
  }
}

// vLLM's /classify body (openai/classify_routes.h): a text or a list of texts, the model optional; what would
// change the answer and is not answered here is refused naming the field.
TEST(OpenAiClassifyTest, BodiesAreReadAsVllmReadsThem) {
  absl::StatusOr<OpenAiClassify> c = ParseOpenAiClassify(R"({"model": "topics", "input": ["a", "b"], "user": "u"})", 4);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model, "topics");
  EXPECT_EQ(c->texts, (std::vector<std::string>{"a", "b"}));
  c = ParseOpenAiClassify(R"({"input": "a", "use_activation": true, "add_special_tokens": true})", 4);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->model.empty());
  for (const auto& [body, message] : std::vector<std::pair<const char*, const char*>>{
           {R"({"model": 3, "input": "a"})", "model: not a name"},
           {R"({"model": "m"})", "input: missing"},
           {R"({"input": {}})", "input: a text or a list of texts"},
           {R"({"input": ["a", 7]})", "input[1]: token ids are not read here"},
           {R"({"input": [[1, 2]]})", "input[0]: token ids are not read here"},
           {R"({"input": ["a", "b", "c", "d", "e"]})", "input: 5 texts, more than 4"},
           {R"({"input": "a", "truncate_prompt_tokens": 8})", "truncate_prompt_tokens: not read here"},
           {R"({"input": "a"})"
            "\xff",
            "request body"},
       }) {
    absl::StatusOr<OpenAiClassify> bad = ParseOpenAiClassify(body, 4);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_NE(bad.status().message().find(message), std::string::npos) << body << ": " << bad.status();
  }
  const nlohmann::json error = nlohmann::json::parse(OpenAiError(absl::NotFoundError("no model 'x'")).body);
  EXPECT_EQ(
      error,
      (nlohmann::json{
          {"error", {{"message", "no model 'x'"}, {"type", "NotFoundError"}, {"param", nullptr}, {"code", 404}}}}));
  EXPECT_EQ(OpenAiError(absl::ResourceExhaustedError("full")).status, 429);
  EXPECT_EQ(OpenAiError(absl::InternalError("broke")).status, 500);
}

// Every path of /openapi.json routes, with its method, and every route is in it.
TEST(HttpRouteTest, TheOpenApiDocumentListsEveryRouteAndOnlyRoutes) {
  const nlohmann::json doc = nlohmann::json::parse(OpenApiDocument());
  EXPECT_EQ(doc["openapi"], "3.1.0");
  std::set<HttpRoute::Kind> documented;
  for (const auto& [path, operations] : doc["paths"].items()) {
    std::string target = path;
    for (const auto& [from, to] :
         std::vector<std::pair<std::string, std::string>>{{"{model}", "m"}, {"{version}", "2"}}) {
      if (const size_t at = target.find(from); at != std::string::npos) target.replace(at, from.size(), to);
    }
    for (const auto& [method, operation] : operations.items()) {
      std::string upper = method;
      std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
      absl::StatusOr<HttpRoute> r = ParseRoute(upper, target);
      ASSERT_TRUE(r.ok()) << upper << " " << target << ": " << r.status();
      documented.insert(r->kind);
      EXPECT_TRUE(operation.contains("responses") && operation["responses"].contains("default")) << path;
    }
  }
  EXPECT_EQ(documented.size(), static_cast<size_t>(HttpRoute::Kind::kRepositoryUnload) + 1)
      << "a route is not documented";
}

// Every "$ref" of the document names a schema it has, and the proto's messages are there by full name
// with their fields in protobuf's JSON names.
TEST(HttpRouteTest, TheOpenApiSchemasResolveAndFollowTheProto) {
  const nlohmann::json doc = nlohmann::json::parse(OpenApiDocument());
  const nlohmann::json& schemas = doc["components"]["schemas"];
  size_t refs = 0;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& j) {
    if (j.is_object()) {
      if (j.contains("$ref")) {
        const std::string ref = j["$ref"];
        const std::string prefix = "#/components/schemas/";
        ASSERT_EQ(ref.rfind(prefix, 0), 0u) << ref;
        EXPECT_TRUE(schemas.contains(ref.substr(prefix.size()))) << ref;
        ++refs;
      }
      for (const auto& [key, value] : j.items()) walk(value);
    } else if (j.is_array()) {
      for (const auto& value : j) walk(value);
    }
  };
  walk(doc);
  EXPECT_GT(refs, 20u);
  const nlohmann::json& options = schemas["qvi.serving.v1.OutputOptions"]["properties"];
  EXPECT_EQ(options["topK"], (nlohmann::json{{"type", "integer"}}));
  EXPECT_EQ(options["layers"]["$ref"], "#/components/schemas/qvi.serving.v1.LayerOptions");
  EXPECT_EQ(schemas["qvi.serving.v1.ClassifyRequest"]["properties"]["texts"]["items"]["type"], "string");
  EXPECT_TRUE(schemas.contains("qvi.serving.v1.TruncationPolicy"));
  EXPECT_EQ(doc["paths"]["/v1/models/{model}:classify"]["post"]["requestBody"]["content"]["application/json"]["schema"]
               ["$ref"],
            "#/components/schemas/qvi.serving.v1.ClassifyRequest");
}

TEST(HttpRouteTest, StatusCodesFollowTheGrpcCodes) {
  EXPECT_EQ(HttpStatus(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kCancelled), 499);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kInternal), 500);
}

// A request on a connection the test holds; the answer's status and body.
std::pair<int, std::string> Exchange(beast::tcp_stream& stream, const std::string& target) {
  http::request<http::string_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "test");
  req.keep_alive(true);
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(stream, buffer, res);
  return {static_cast<int>(res.result_int()), res.body()};
}

TEST(HttpServerTest, AnswersFromOtherThreadsOverOneConnectionAndDrainsOnShutdown) {
  std::promise<HttpServer::Reply> held;  // the request to /slow, answered by the test later
  std::vector<std::thread> repliers;
  HttpServer::Options options;
  options.host = "127.0.0.1";
  options.port = 0;
  HttpServer server(options, [&](HttpRequest request, HttpServer::Reply reply) {
    if (request.target == "/slow") {
      held.set_value(std::move(reply));
      return;
    }
    // Answered from a thread of its own, as the core answers from a model instance's thread.
    repliers.emplace_back([reply = std::move(reply), target = request.target] {
      reply(HttpResponse{200, "text/plain", "answer to " + target, {}});
    });
  });
  absl::StatusOr<int> port = server.Start();
  ASSERT_TRUE(port.ok()) << port.status();

  boost::asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(*port)));
  EXPECT_EQ(Exchange(stream, "/a"), std::make_pair(200, std::string("answer to /a")));
  EXPECT_EQ(Exchange(stream, "/b"), std::make_pair(200, std::string("answer to /b"))) << "the same connection";

  // A request in flight when the shutdown starts is still answered, within the deadline.
  auto slow = std::async(std::launch::async, [&] { return Exchange(stream, "/slow"); });
  HttpServer::Reply reply = held.get_future().get();
  EXPECT_EQ(server.in_flight(), 1);
  std::thread shutdown([&] { server.Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(30)); });
  reply(HttpResponse{200, "text/plain", "late", {}});
  EXPECT_EQ(slow.get(), std::make_pair(200, std::string("late")));
  shutdown.join();
  EXPECT_EQ(server.in_flight(), 0);
  for (std::thread& t : repliers) t.join();
}

TEST(ExplainPageTest, TheScriptHashIsTheCspsSha256InBase64) {
  // The digest of nothing, as every CSP tutorial spells it, and of "alert(1)" (openssl dgst | base64).
  EXPECT_EQ(CspScriptHash(""), "sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=");
  EXPECT_EQ(CspScriptHash("alert(1)"), "sha256-bhHHL3z2vDgxUt0W3dWQOrprscmda2Y5pLsLg4GF+pI=");
}

TEST(ExplainPageTest, ThePageInlinesItsFilesAndItsPolicyAllowsOnlyItsScript) {
  const HttpResponse& page = ExplainPageResponse();
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(page.body.find("/*QVI_"), std::string::npos) << "a marker was left in the page";
  const size_t open = page.body.find("<script>"), close = page.body.find("</script>");
  ASSERT_NE(open, std::string::npos);
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(page.body.find("<script", open + 1), std::string::npos) << "one script only";
  const std::string script = page.body.substr(open + 8, close - open - 8);
  EXPECT_NE(script.find("loadModels"), std::string::npos);
  EXPECT_NE(page.body.find(".tok {"), std::string::npos) << "report.css is not inlined";
  std::string csp;
  for (const auto& [name, value] : page.headers) {
    if (name == "Content-Security-Policy") csp = value;
  }
  EXPECT_NE(csp.find("script-src '" + CspScriptHash(script) + "'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("default-src 'none'"), std::string::npos) << csp;
}

namespace proto_json_test {

namespace v1 = serving::v1;

std::string RandomText(std::mt19937& rng) {
  static const std::vector<std::string> pieces = {"a",
                                                  "Z",
                                                  " ",
                                                  "\"",
                                                  "\\",
                                                  "/",
                                                  "\n",
                                                  "\t",
                                                  "\r",
                                                  "\b",
                                                  "\f",
                                                  std::string(1, '\0'),
                                                  "\x01",
                                                  "\x1f",
                                                  "\x7f",
                                                  "<",
                                                  ">",
                                                  "&",
                                                  "'",
                                                  "=",
                                                  "\xe2\x80\xa8",
                                                  "\xe2\x80\xa9",
                                                  "\xc3\xa9",
                                                  "\xe6\x9d\xb1",
                                                  "\xf0\x9f\x98\x80",
                                                  "%",
                                                  "\xc2\x85",
                                                  "\xef\xbb\xbf",
                                                  "{",
                                                  "}",
                                                  "[",
                                                  "]",
                                                  ":",
                                                  ",",
                                                  "0",
                                                  "\xc2\xad",
                                                  "\xe2\x80\x8b",
                                                  "\xd8\x80",
                                                  "\xf3\xa0\x80\xa0",
                                                  "\xf0\x9d\x85\xb3",
                                                  "\xef\xbf\xb9",
                                                  "\xe2\x81\xaa",
                                                  "\xc2\xa0",
                                                  "\xe2\x80\xaf"};
  std::string s;
  const int n = std::uniform_int_distribution<int>(0, 12)(rng);
  for (int i = 0; i < n; ++i) s += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
  return s;
}

float RandomFloat(std::mt19937& rng) {
  switch (std::uniform_int_distribution<int>(0, 9)(rng)) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return std::uniform_int_distribution<int>(0, 1)(rng) ? std::numeric_limits<float>::infinity()
                                                           : -std::numeric_limits<float>::infinity();
    case 2:
      return std::numeric_limits<float>::denorm_min() * std::uniform_int_distribution<int>(1, 1000)(rng);
    case 3:
      return -0.0f;
    case 4:
      return std::uniform_real_distribution<float>(-1e30f, 1e30f)(rng);
    case 5:
      return static_cast<float>(std::uniform_int_distribution<int>(-100000, 100000)(rng));
    case 6:
      return 1.0f / static_cast<float>(std::uniform_int_distribution<int>(1, 1000)(rng));
    default:
      return std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
  }
}

void FillToken(std::mt19937& rng, v1::Token* t) {
  t->set_text(RandomText(rng));
  t->set_start(rng() % 1000);
  t->set_end(rng());
  t->set_byte_start(rng() % 7);
  t->set_normalized(RandomText(rng));
  t->set_id(static_cast<int32_t>(rng()));
  if (rng() % 2) t->set_attention(RandomFloat(rng));
  if (rng() % 2) t->set_gate(RandomFloat(rng));
  if (rng() % 3 == 0) t->set_tag(RandomText(rng));
  if (rng() % 4 == 0) t->set_lambda_q(RandomFloat(rng));
}

void FillLayers(std::mt19937& rng, google::protobuf::RepeatedPtrField<v1::LayerMap>* layers) {
  for (int l = static_cast<int>(rng() % 3); l > 0; --l) {
    v1::LayerMap* m = layers->Add();
    m->set_layer(static_cast<int32_t>(rng() % 5) - 1);
    m->set_head(-1);
    for (int k = static_cast<int>(rng() % 5); k > 0; --k) m->add_gates(RandomFloat(rng));
    for (int k = static_cast<int>(rng() % 5); k > 0; --k) m->add_attention(RandomFloat(rng));
  }
}

template <typename Response>
void ExpectSameAsProtobuf(const Response& r) {
  std::string ours;
  ASSERT_TRUE(WriteProtoJson(r, &ours));
  std::string theirs;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(r, &theirs, options).ok());
  ASSERT_EQ(ours, theirs) << r.DebugString();
}

// The answers' JSON, written by reflection, is byte for byte protobuf's own on random answers: odd
// strings (quotes, controls, HTML characters, U+2028, emoji), floats of every kind, optional fields set
// and unset, empty and full lists.
TEST(ProtoJsonTest, WritesTheAnswersAsProtobufDoes) {
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    v1::ClassifyResponse c;
    c.mutable_model()->set_name(RandomText(rng));
    c.mutable_model()->set_version(static_cast<int64_t>(rng()) * (rng() % 2 ? -1 : 1));
    c.set_request_id(RandomText(rng));
    for (int i = static_cast<int>(rng() % 3); i > 0; --i) {
      v1::Classification* r = c.add_results();
      for (int l = static_cast<int>(rng() % 3); l > 0; --l) {
        v1::LabelScore* s = r->add_labels();
        s->set_label(RandomText(rng));
        s->set_score(RandomFloat(rng));
      }
      for (int t = static_cast<int>(rng() % 4); t > 0; --t) FillToken(rng, r->add_tokens());
      r->set_truncated(rng() % 2);
      r->set_num_tokens(rng());
      FillLayers(rng, r->mutable_layers());
      if (rng() % 3 == 0) {
        r->mutable_faithfulness()->set_label(RandomText(rng));
        r->mutable_faithfulness()->set_score_without(RandomFloat(rng));
        r->mutable_faithfulness()->add_removed(rng());
      }
      if (rng() % 3 == 0) {  // options.coverage: doubles, and a list that may be empty
        r->mutable_label_set()->set_coverage(static_cast<double>(RandomFloat(rng)) / 3);
        r->mutable_label_set()->set_min_probability(1.0 / (1 + rng() % 1000));
        for (int l = static_cast<int>(rng() % 3); l > 0; --l) r->mutable_label_set()->add_labels(RandomText(rng));
      }
      r->set_abstained(rng() % 2);
    }
    ExpectSameAsProtobuf(c);
    v1::TagResponse t;
    t.set_request_id(RandomText(rng));
    for (int i = static_cast<int>(rng() % 3); i > 0; --i) {
      v1::Tagging* r = t.add_results();
      for (int s = static_cast<int>(rng() % 3); s > 0; --s) {
        v1::Span* span = r->add_spans();
        span->set_label(RandomText(rng));
        span->set_text(RandomText(rng));
        span->set_score(RandomFloat(rng));
        span->set_token_end(rng());
        span->set_abstained(rng() % 2);
      }
      for (int k = static_cast<int>(rng() % 4); k > 0; --k) FillToken(rng, r->add_tokens());
      FillLayers(rng, r->mutable_layers());
    }
    ExpectSameAsProtobuf(t);
  }
}

double RandomDouble(std::mt19937& rng) {
  switch (std::uniform_int_distribution<int>(0, 4)(rng)) {
    case 0:
      return std::numeric_limits<double>::quiet_NaN();
    case 1:
      return std::numeric_limits<double>::denorm_min() * std::uniform_int_distribution<int>(1, 1000)(rng);
    case 2:
      return 1.0 / std::uniform_int_distribution<int>(1, 1000)(rng);
    case 3:
      return std::uniform_real_distribution<double>(-1e300, 1e300)(rng);
    default:
      return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  }
}

// The model routes' answers too (ListModels, GetModel): enums, doubles, int64s, nested messages set
// and unset, the faithfulness figures.
TEST(ProtoJsonTest, WritesTheModelListsAsProtobufDoes) {
  std::mt19937 rng(11);
  for (int round = 0; round < 1000; ++round) {
    v1::ListModelsResponse list;
    for (int i = static_cast<int>(rng() % 3); i > 0; --i) {
      v1::ModelInfo* info = list.add_models();
      info->set_name(RandomText(rng));
      for (int k = static_cast<int>(rng() % 3); k > 0; --k) {
        v1::ModelVersion* v = info->add_versions();
        v->set_version(static_cast<int64_t>(rng()));
        v->set_state(static_cast<v1::ModelState>(rng() % 5));
        v->set_reason(RandomText(rng));
        if (rng() % 3 == 0) continue;  // no metadata
        v1::ModelMetadata* md = v->mutable_metadata();
        md->set_task(RandomText(rng));
        md->add_labels(RandomText(rng));
        md->set_layers(static_cast<int32_t>(rng() % 13));
        md->mutable_tokenizer()->set_max_tokens(static_cast<int32_t>(rng() % 512));
        md->mutable_batching()->set_max_queue_delay_ms(RandomDouble(rng));
        md->mutable_batching()->set_max_queued_tokens(static_cast<int64_t>(rng()) << 20);
        if (rng() % 2) md->mutable_cuda_graphs()->set_capture_ms(RandomDouble(rng));
        v1::OutputInfo* o = md->add_outputs();
        o->set_name(RandomText(rng));
        o->add_shape("B");
        if (rng() % 2) {
          v1::Faithfulness* f = md->mutable_faithfulness();
          f->set_measured(true);
          f->add_ks(static_cast<int32_t>(rng() % 50));
          v1::MethodFaithfulness* m = f->add_methods();
          m->set_name(RandomText(rng));
          m->mutable_comprehensiveness()->set_mean(RandomDouble(rng));
          if (rng() % 2) m->mutable_loo_spearman()->set_low(RandomDouble(rng));
        }
      }
    }
    ExpectSameAsProtobuf(list);
  }
}

// Not UTF-8: left to protobuf, which says so, rather than written as broken JSON.
TEST(ProtoJsonTest, RefusesWhatIsNotUtf8) {
  for (const std::string bad : {"\xff", "a\xc3", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80"}) {
    v1::ClassifyResponse c;
    c.set_request_id(bad);
    std::string out;
    EXPECT_FALSE(WriteProtoJson(c, &out)) << absl::CEscape(bad);
  }
}

}  // namespace proto_json_test

namespace json_body_test {

namespace v1 = serving::v1;
using proto_json_test::RandomText;

constexpr int kMaxTexts = 256;

// protobuf's own converter on `body`: the reference ParseBody's one walk must agree with.
template <typename Request>
absl::Status Theirs(const std::string& body, Request* out) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(body, out, options);
  return status.ok() ? absl::OkStatus() : absl::InvalidArgumentError(status.message().as_string());
}

template <typename Request>
void ExpectSameAsProtobuf(const std::string& body) {
  Request ours, theirs;
  const absl::Status got = ParseBody(body, kMaxTexts, &ours);
  ASSERT_TRUE(got.ok()) << body << "\n" << got;
  ASSERT_TRUE(Theirs(body, &theirs).ok()) << body;
  ASSERT_EQ(ours.SerializeAsString(), theirs.SerializeAsString()) << body << "\n" << ours.DebugString();
}

void FillOptions(std::mt19937& rng, v1::OutputOptions* o) {
  o->set_top_k(static_cast<int32_t>(rng()));
  o->set_attention(rng() % 2);
  o->set_gates(rng() % 2);
  o->set_tokens(rng() % 2);
  o->set_raw_scores(rng() % 2);
  // proto3 optional fields: present (0 included) or absent
  if (rng() % 2) o->set_coverage(static_cast<double>(rng() % 5) / 4);
  if (rng() % 2) o->set_abstain_below(static_cast<double>(rng() % 1000) / 999);
  o->set_truncation(static_cast<v1::TruncationPolicy>(rng() % 2));
  if (rng() % 2) o->mutable_faithfulness()->set_top_k(static_cast<int32_t>(rng() % 40) - 5);
  if (rng() % 2) {
    v1::LayerOptions* l = o->mutable_layers();
    l->set_gates(rng() % 2);
    l->set_attention_maps(rng() % 2);
    for (int k = static_cast<int>(rng() % 4); k > 0; --k) l->add_layers(static_cast<int32_t>(rng()));
    for (int k = static_cast<int>(rng() % 4); k > 0; --k) l->add_heads(static_cast<int32_t>(rng() % 9) - 1);
    l->set_reduction(static_cast<v1::LayerReduction>(rng() % 3));
  }
}

// Random requests, written by protobuf with JSON names or proto names, defaults printed or left out,
// enums as names or numbers: the one walk builds the message protobuf's converter builds.
TEST(JsonBodyTest, ReadsRequestsAsProtobufDoes) {
  std::mt19937 rng(5);
  for (int round = 0; round < 2000; ++round) {
    v1::ClassifyRequest c;
    if (rng() % 2) {
      c.mutable_model()->set_name(RandomText(rng));
      c.mutable_model()->set_version(static_cast<int64_t>(rng()) * (rng() % 2 ? -1 : 1) << (rng() % 32));
    }
    for (int i = static_cast<int>(rng() % 5); i > 0; --i) c.add_texts(RandomText(rng));
    if (rng() % 2) FillOptions(rng, c.mutable_options());
    c.set_request_id(RandomText(rng));
    google::protobuf::util::JsonPrintOptions print;
    print.always_print_primitive_fields = rng() % 2;
    print.preserve_proto_field_names = rng() % 2;
    print.always_print_enums_as_ints = rng() % 2;
    std::string body;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(c, &body, print).ok());
    ExpectSameAsProtobuf<v1::ClassifyRequest>(body);
    v1::TagRequest t;
    t.mutable_texts()->CopyFrom(c.texts());
    t.mutable_options()->CopyFrom(c.options());
    body.clear();  // MessageToJsonString appends
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(t, &body, print).ok());
    ExpectSameAsProtobuf<v1::TagRequest>(body);
  }
}

// The forms a person writes by hand that the mapping allows: numbers as strings or with an exponent,
// enums by number, null for a default, proto names beside JSON names, escapes, white space.
TEST(JsonBodyTest, ReadsTheHandWrittenFormsAsProtobufDoes) {
  for (
      const std::string body : {
          R"({})",
          R"({"texts": []})",
          R"( { "texts" : [ "a" , "b\u00e9\n\"" ] } )",
          R"({"texts": ["a"], "options": {"topK": "3"}})",
          R"({"texts": ["a"], "options": {"top_k": -2}})",
          R"({"options": {"topK": 3.0}})",
          R"({"options": {"topK": 3e2}})",
          R"({"options": {"topK": 2147483647}})",
          R"({"options": {"topK": "-2147483648"}})",
          R"({"options": {"truncation": 1}})",
          R"({"options": {"truncation": "TRUNCATION_POLICY_ERROR"}})",
          R"({"options": {"truncation": 7}})",
          R"({"options": {"truncation": 1e0}})",
          R"({"options": null, "model": null, "texts": null, "requestId": null})",
          R"({"options": {"layers": {"layers": [0, "1", 2.0], "heads": [], "reduction": "LAYER_REDUCTION_MEAN_ALL"}}})",
          R"({"options": {"faithfulness": {"top_k": 5}, "attention": true, "gates": false}})",
          R"({"model": {"name": "sentiment", "version": "9007199254740993"}})",
          R"({"model": {"version": 9223372036854775807}})",
          R"({"model": {"version": "-9223372036854775808"}})",
          R"({"request_id": "r-1", "texts": ["\ud83d\ude00"]})",
          R"({"options": {"coverage": 0.9, "abstainBelow": "0.5", "rawScores": true}})",
          R"({"options": {"coverage": 0, "abstain_below": null}})",
      }) {
    ExpectSameAsProtobuf<v1::ClassifyRequest>(body);
  }
}

// What the mapping does not allow is refused naming the field, the value and what was expected; what
// it leaves open is refused too (a field given twice, null in a list).
TEST(JsonBodyTest, RefusesNamingTheFieldAndWhatItTakes) {
  const std::pair<std::string, std::string> cases[] = {
      {R"([])", "request body: a JSON object is expected"},
      {R"("texts")", "request body: a JSON object is expected"},
      {R"({"textz": ["a"]})",
       "request body: textz: no such field; ClassifyRequest has model, texts, options, requestId"},
      {R"({"options": {"topk": 1}})", "request body: options.topk: no such field; OutputOptions has topK"},
      {R"({"options": {"topK": 1e99}})", "request body: options.top_k: 1e99 is not a whole number within int32"},
      {R"({"options": {"topK": 1.5}})", "request body: options.top_k: 1.5 is not a whole number within int32"},
      {R"({"options": {"topK": 2147483648}})", "request body: options.top_k: 2147483648 is not a whole number within"},
      {R"({"options": {"topK": " 3"}})", R"(request body: options.top_k: " 3" is not a whole number)"},
      {R"({"options": {"topK": "0x10"}})", R"(request body: options.top_k: "0x10" is not a whole number)"},
      {R"({"options": {"topK": true}})", "request body: options.top_k: true is not a whole number"},
      {R"({"options": {"attention": "true"}})", R"(request body: options.attention: "true" is not true or false)"},
      {R"({"options": {"truncation": "error"}})",
       R"(request body: options.truncation: "error" is not one of TruncationPolicy's names (TRUNCATION_POLICY_TRUNCATE, TRUNCATION_POLICY_ERROR) or a number)"},
      {R"({"options": {"truncation": 1.5}})", "request body: options.truncation: 1.5 is not one of"},
      {R"({"options": {"truncation": "1"}})", R"(request body: options.truncation: "1" is not one of)"},
      {R"({"texts": "a"})", R"(request body: texts: "a" is not a list of which each is a string)"},
      {R"({"texts": [1]})", "request body: texts: 1 is not a string"},
      {R"({"texts": [["a"]]})", "request body: texts: a list is not a string"},
      {R"({"texts": [null]})", "request body: texts: null is not a string"},
      {R"({"texts": [{}]})", "request body: texts: an object is not a string"},
      {R"({"options": []})", "request body: options: a list is not an object (OutputOptions)"},
      {R"({"options": 3})", "request body: options: 3 is not an object (OutputOptions)"},
      {R"({"options": {"layers": {"layers": {}}}})",
       "request body: options.layers.layers: an object is not a list of which each is a whole number within int32"},
      {R"({"texts": ["a"], "texts": ["b"]})", "request body: texts: given twice"},
      {R"({"texts": ["a"], "options": {}, "options": {}})", "request body: options: given twice"},
      {R"({"model": {"version": 9223372036854775808}})", "request body: model.version: 9223372036854775808 is not"},
      {R"({"model": {"version": "1e3"}})", R"(request body: model.version: "1e3" is not a whole number within int64)"},
      {R"({"requestId": 5})", "request body: request_id: 5 is not a string"},
      {R"({"texts": ["a")", "request body: not valid JSON at byte"},
  };
  for (const auto& [body, error] : cases) {
    v1::ClassifyRequest request;
    const absl::Status got = ParseBody(body, kMaxTexts, &request);
    EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_EQ(got.message().substr(0, error.size()), error) << body;
  }
}

// The client's strings are quoted clipped: a 100,000-byte key or value costs an error of a few hundred bytes.
TEST(JsonBodyTest, ErrorsQuoteTheClientClipped) {
  for (const std::string body : {R"({")" + std::string(100000, 'k') + R"(": 1})",
                                 R"({"options": {"truncation": ")" + std::string(100000, 'x') + R"("}})",
                                 R"({"options": {"topK": 1)" + std::string(100000, '0') + R"(.5}})"}) {
    v1::ClassifyRequest request;
    const absl::Status got = ParseBody(body, kMaxTexts, &request);
    EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_LT(got.message().size(), 400u) << got.message().substr(0, 400);
  }
}

// The texts limit holds in the one walk as in the scan: refused at the first text over it.
TEST(JsonBodyTest, RefusesMoreTextsThanTheLimit) {
  std::string body = R"({"texts": [)";
  for (int i = 0; i < 5; ++i) body += i > 0 ? R"(,"a")" : R"("a")";
  body += "]}";
  v1::ClassifyRequest request;
  EXPECT_EQ(ParseBody(body, 4, &request).message(), "texts: more than 4 texts; the limit is 4 per request");
  EXPECT_TRUE(ParseBody(body, 5, &request).ok());
}

}  // namespace json_body_test

}  // namespace
}  // namespace qvi

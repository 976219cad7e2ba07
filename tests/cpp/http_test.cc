// The HTTP port's routing, its status mapping, and the server itself with a handler of the test's:
// answers from another thread, keep-alive, and a shutdown that lets a request in flight finish.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <future>
#include <set>
#include <thread>

#include "nlohmann/json.hpp"

#include "server/http/explain_page.h"
#include "server/http/http_api.h"
#include "server/http/http_server.h"

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
       }) {
    absl::StatusOr<HttpRoute> r = ParseRoute(c.method, c.target);
    ASSERT_TRUE(r.ok()) << c.target << ": " << r.status();
    EXPECT_EQ(r->kind, c.kind) << c.target;
    EXPECT_EQ(r->model, c.model) << c.target;
    EXPECT_EQ(r->version, c.version) << c.target;
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
           {"POST", "/", absl::StatusCode::kFailedPrecondition, "method POST is not allowed on /; use GET"},
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
      const std::string upper = method == "get" ? "GET" : "POST";
      absl::StatusOr<HttpRoute> r = ParseRoute(upper, target);
      ASSERT_TRUE(r.ok()) << upper << " " << target << ": " << r.status();
      documented.insert(r->kind);
      EXPECT_TRUE(operation.contains("responses") && operation["responses"].contains("default")) << path;
    }
  }
  EXPECT_EQ(documented.size(), static_cast<size_t>(HttpRoute::Kind::kPage) + 1) << "a route is not documented";
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

}  // namespace
}  // namespace qvi

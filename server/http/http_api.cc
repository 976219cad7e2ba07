#include "server/http/http_api.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "server/core/spec/request_checks.h"
#include "server/grpc/convert.h"
#include "server/grpc/request_from_proto.h"
#include "server/http/explain_page.h"
#include "server/http/json_body.h"
#include "server/http/kserve_rest.h"
#include "server/http/proto_json.h"
#include "server/logging.h"

namespace qvi {

namespace v1 = ::qvi::serving::v1;

namespace {

HttpResponse JsonError(int status, absl::string_view message) {
  return HttpResponse{
      status,
      "application/json",
      nlohmann::json{{"error", std::string(message)}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      {}};
}

HttpResponse ErrorResponse(const absl::Status& status) {
  return JsonError(HttpStatus(status.code()), status.message());
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  std::string out;
  if (WriteProtoJson(message, &out)) return out;  // protobuf's bytes, written directly (proto_json.h)
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;  // a token at offset 0 says "start": 0
  const auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) return absl::InternalError(absl::StrCat("writing the answer as JSON failed: ", status.ToString()));
  return out;
}

// X-Request-Timeout-Ms: the call's deadline, in milliseconds from its arrival (as gRPC's grpc-timeout
// is for a gRPC call); absent: none.
absl::StatusOr<absl::Duration> RequestTimeout(absl::string_view header) {
  if (header.empty()) return absl::InfiniteDuration();
  constexpr int64_t kMaxMs = int64_t{24} * 3600 * 1000;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(header, &ms) || ms < 1 || ms > kMaxMs) {
    return absl::InvalidArgumentError(absl::StrCat("X-Request-Timeout-Ms: '", header.substr(0, 40),
                                                   "' is not a whole number of milliseconds from 1 to ", kMaxMs));
  }
  return absl::Milliseconds(ms);
}

// One Classify, Tag or KServe v2 infer call over HTTP, from its arrival to its answer: the bytes it
// holds against --max-inflight-request-bytes, its deadline, and its count in the metrics and the
// access log (with its trace), as a gRPC call's (infer_call.h).
struct HttpCall {
  HttpCall(InferCalls* c, const char* m, const HttpRequest& request, HttpServer::Reply r)
      : calls(c),
        method(m),
        peer(request.peer),
        start(c->env().Now()),
        bytes(static_cast<int64_t>(request.body.size())),
        trace(c->TraceOf(request.Header("traceparent"))),
        reply(std::move(r)) {
    c->OnCallStart();
    held = c->HoldBytes(bytes);
  }

  absl::Status HoldAnswer(int64_t answer) {
    int64_t none = 0;
    if (answered.load() || answer <= 0 || !answer_bytes.compare_exchange_strong(none, answer)) return absl::OkStatus();
    return calls->CheckHeld(calls->HoldBytes(answer), answer);
  }

  void Fail(const absl::Status& status) { Finish(status, ErrorResponse(status)); }

  void Finish(const absl::Status& status, HttpResponse response, const AnswerSummary* summary = nullptr) {
    if (answered.exchange(true)) return;
    calls->ReleaseBytes(bytes + answer_bytes.load());
    try {
      calls->Record(method, peer, model, request_id, texts, ToGrpcStatus(status), start,
                    status.ok() ? summary : nullptr, trace);
    } catch (...) {
      spdlog::error("counting a finished HTTP {} call (request_id {}) failed: {}", method, Capped(request_id),
                    CurrentExceptionText());
    }
    if (!request_id.empty()) response.headers.emplace_back("X-Request-Id", request_id);
    reply(std::move(response));
  }

  // The answer's body, or why there is none; `building` is when the body began (the access log's
  // serialise time).
  void Answer(const InferenceResponse& answer, absl::Time building, absl::StatusOr<std::string> body,
              std::string content_type = "application/json",
              std::vector<std::pair<std::string, std::string>> headers = {}) {
    if (!body.ok()) return Fail(body.status());
    const AnswerSummary summary{
        answer.version,   answer.tokens,       answer.queue_time,       answer.compute_time,
        answer.queued_at, answer.forward_time, answer.postprocess_time, calls->env().Now() - building};
    Finish(absl::OkStatus(), HttpResponse{200, std::move(content_type), *std::move(body), std::move(headers)},
           &summary);
  }

  InferCalls* const calls;
  const char* const method;
  const std::string peer;
  const absl::Time start;
  const int64_t bytes;
  const CallTrace trace;
  int64_t held = 0;
  std::atomic<int64_t> answer_bytes{0};
  std::atomic<bool> answered{false};
  std::string model, request_id;
  int64_t texts = 0;
  HttpServer::Reply reply;
};

// What every inference route does once its request is read: the request id (the body's, else the
// X-Request-Id header's, else one made up), the deadline (the sooner of the request's and
// X-Request-Timeout-Ms), and the answer's bytes held against the limit once estimated.
absl::Status Prepare(const std::shared_ptr<HttpCall>& call, const HttpRequest& request, int max_request_id_bytes,
                     InferenceRequest& r) {
  if (r.request_id.empty()) r.request_id = request.Header("X-Request-Id");  // the core checks its length
  if (r.request_id.empty()) r.request_id = call->calls->NextRequestId();
  if (static_cast<int>(r.request_id.size()) <= max_request_id_bytes) call->request_id = r.request_id;
  call->texts = static_cast<int64_t>(r.texts.size());
  absl::StatusOr<absl::Duration> timeout = RequestTimeout(request.Header("X-Request-Timeout-Ms"));
  if (!timeout.ok()) return timeout.status();
  if (*timeout != absl::InfiniteDuration()) r.deadline = std::min(r.deadline, call->start + *timeout);
  r.hold_answer_bytes = [call](int64_t bytes) { return call->HoldAnswer(bytes); };
  return absl::OkStatus();
}

// The answer over the send limit (--max-message-bytes) is RESOURCE_EXHAUSTED, as over gRPC.
absl::StatusOr<std::string> WithinSendLimit(const InferCalls* calls, absl::StatusOr<std::string> json) {
  const int64_t limit = calls->options().max_response_bytes;
  if (!json.ok() || limit <= 0 || static_cast<int64_t>(json->size()) <= limit) return json;
  return absl::ResourceExhaustedError(absl::StrCat("the answer is ", json->size(), " bytes, over the limit of ", limit,
                                                   " bytes (--max-message-bytes); ask for fewer texts or outputs"));
}

// Inference-Header-Content-Length (the binary-data extension): how much of the body is its JSON header;
// without it, all of the body.
absl::StatusOr<size_t> JsonHeaderBytes(const HttpRequest& request) {
  const std::string header = request.Header("Inference-Header-Content-Length");
  if (header.empty()) return request.body.size();
  uint64_t n = 0;
  if (!absl::SimpleAtoi(header, &n) || n > request.body.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Inference-Header-Content-Length: '", header.substr(0, 40),
                                                   "' is not a length within the body's ", request.body.size(),
                                                   " bytes"));
  }
  return static_cast<size_t>(n);
}

template <typename Request, typename Response>
void Serve(InferenceService* core, InferCalls* calls, Method method, const HttpRoute& route, HttpRequest request,
           HttpServer::Reply reply) {
  auto call =
      std::make_shared<HttpCall>(calls, method == Method::kClassify ? "Classify" : "Tag", request, std::move(reply));
  call->model = route.model;
  if (absl::Status admitted = calls->CheckHeld(call->held, 0); !admitted.ok()) return call->Fail(admitted);
  Request message;
  if (absl::Status parsed = ParseBody(request.body, core->limits().max_texts, &message); !parsed.ok()) {
    return call->Fail(parsed);
  }
  request.body.clear();
  if (message.has_model() && ((!message.model().name().empty() && message.model().name() != route.model) ||
                              (message.model().version() != 0 && message.model().version() != route.version))) {
    return call->Fail(absl::InvalidArgumentError(
        "model: the body names another model or version than the path; leave it out of the body"));
  }
  message.mutable_model()->set_name(route.model);
  message.mutable_model()->set_version(route.version);
  InferenceRequest r = FromProto(message.model(), message.texts(), message.options(), message.request_id());
  if (absl::Status s = Prepare(call, request, core->limits().max_request_id_bytes, r); !s.ok()) return call->Fail(s);
  core->Submit(method, std::move(r), [call, calls](absl::StatusOr<InferenceResponse> answer) {
    if (!answer.ok()) return call->Fail(answer.status());
    const absl::Time building = calls->env().Now();
    absl::StatusOr<std::string> json;
    try {
      Response out;
      ToProto(*answer, &out);
      json = ToJson(out);
    } catch (...) {
      json = absl::InternalError(absl::StrCat("building the answer failed: ", CurrentExceptionText()));
    }
    call->Answer(*answer, building, WithinSendLimit(calls, std::move(json)));
  });
}

// KServe v2's infer: the JSON tensors become an OIP ModelInfer request, planned and answered by the
// OIP service's own code (oip_service.h), the answer's tensors written back as JSON.
void ServeInfer(InferenceService* core, InferCalls* calls, const OipServiceImpl* oip, const HttpRoute& route,
                HttpRequest request, HttpServer::Reply reply) {
  auto call = std::make_shared<HttpCall>(calls, "ModelInfer", request, std::move(reply));
  call->model = route.model;
  if (absl::Status admitted = calls->CheckHeld(call->held, 0); !admitted.ok()) return call->Fail(admitted);
  // The binary-data extension: the JSON header is the body's first Inference-Header-Content-Length bytes.
  absl::StatusOr<size_t> header_bytes = JsonHeaderBytes(request);
  if (!header_bytes.ok()) return call->Fail(header_bytes.status());
  const std::string_view json_text = std::string_view(request.body).substr(0, *header_bytes);
  if (absl::Status scanned = ScanBody(json_text, core->limits().max_texts); !scanned.ok()) return call->Fail(scanned);
  const nlohmann::json body = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<rest::ParsedInfer> infer =
      rest::InferRequest(body, route.model, route.version > 0 ? absl::StrCat(route.version) : "",
                         std::string_view(request.body).substr(*header_bytes));
  request.body.clear();
  if (!infer.ok()) return call->Fail(infer.status());
  absl::StatusOr<OipServiceImpl::Planned> planned = oip->Plan(infer->request);
  if (!planned.ok()) return call->Fail(planned.status());
  InferenceRequest r = std::move(planned->plan->request);
  if (planned->plan->timeout != absl::InfiniteDuration()) r.deadline = call->start + planned->plan->timeout;
  if (absl::Status s = Prepare(call, request, core->limits().max_request_id_bytes, r); !s.ok()) return call->Fail(s);
  auto asked = std::make_shared<const rest::ParsedInfer>(*std::move(infer));
  core->Submit(
      planned->plan->method, std::move(r),
      [call, calls, oip, plan = planned->plan, asked](absl::StatusOr<InferenceResponse> answer) {
        if (!answer.ok()) return call->Fail(answer.status());
        const absl::Time building = calls->env().Now();
        absl::StatusOr<std::string> body;
        size_t header_size = 0;
        try {
          inference::ModelInferResponse out;
          absl::Status built = oip->BuildAnswer(*answer, *plan, asked->request.id(), &out);
          absl::StatusOr<rest::InferAnswer> tensors =
              built.ok() ? rest::InferResponse(out, *asked) : absl::StatusOr<rest::InferAnswer>(built);
          if (tensors.ok()) {
            body = tensors->header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
            header_size = body->size();
            *body += tensors->binary;
          } else {
            body = tensors.status();
          }
        } catch (...) {
          body = absl::InternalError(absl::StrCat("building the answer failed: ", CurrentExceptionText()));
        }
        body = WithinSendLimit(calls, std::move(body));
        if (!body.ok() || header_size == body->size()) return call->Answer(*answer, building, std::move(body));
        // Outputs in binary follow the JSON: the client finds where by the header, as Triton answers.
        call->Answer(*answer, building, std::move(body), "application/octet-stream",
                     {{"Inference-Header-Content-Length", absl::StrCat(header_size)}});
      },
      std::move(planned->servable));
}

// GET /v2/models/{m}[/versions/{v}][/ready]: OIP's answers in the REST protocol's JSON.
HttpResponse ModelRoute(const OipServiceImpl* oip, const HttpRoute& route) {
  const std::string version = route.version > 0 ? absl::StrCat(route.version) : "";
  if (route.kind == HttpRoute::Kind::kModelReady) {
    inference::ModelReadyRequest in;
    in.set_name(route.model);
    in.set_version(version);
    inference::ModelReadyResponse out;
    if (absl::Status s = oip->ModelReady(in, &out); !s.ok()) return ErrorResponse(s);
    const nlohmann::json body = {{"name", route.model}, {"ready", out.ready()}};
    return HttpResponse{out.ready() ? 200 : 503, "application/json", body.dump(), {}};
  }
  inference::ModelMetadataRequest in;
  in.set_name(route.model);
  in.set_version(version);
  inference::ModelMetadataResponse out;
  if (absl::Status s = oip->ModelMetadata(in, &out); !s.ok()) return ErrorResponse(s);
  return HttpResponse{200,
                      "application/json",
                      rest::ModelMetadata(out).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      {}};
}

// "{m}" or "{m}/versions/{v}" into the route's model and version.
absl::Status ParseModelPath(absl::string_view path, absl::string_view target, HttpRoute& route) {
  std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
  if (parts.empty() || parts[0].empty() || (parts.size() != 1 && parts.size() != 3) ||
      (parts.size() == 3 && parts[1] != "versions")) {
    return absl::NotFoundError(absl::StrCat("no route for ", target.substr(0, 200)));
  }
  route.model = std::string(parts[0]);
  if (parts.size() == 3 && (!absl::SimpleAtoi(parts[2], &route.version) || route.version < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("version: '", parts[2].substr(0, 40), "' is not a positive integer"));
  }
  return absl::OkStatus();
}

// /v2/models/{m}[/versions/{v}][/ready | /infer], with `path` after "/v2/models/".
absl::StatusOr<HttpRoute> ParseV2ModelRoute(absl::string_view path, absl::string_view target) {
  using Kind = HttpRoute::Kind;
  HttpRoute route;
  absl::string_view verb;
  if (absl::EndsWith(path, "/ready") || absl::EndsWith(path, "/infer")) {
    verb = path.substr(path.size() - 5);
    path.remove_suffix(6);
  }
  if (absl::Status s = ParseModelPath(path, target, route); !s.ok()) return s;
  route.kind = verb.empty() ? Kind::kModelMetadata : verb == "ready" ? Kind::kModelReady : Kind::kInfer;
  route.allow = route.kind == Kind::kInfer ? "POST" : "GET";
  return route;
}

// /v1/models/{m}[/versions/{v}][:classify | :tag], with `path` after "/v1/models/"; a model name
// holds no '/' or ':' here.
absl::StatusOr<HttpRoute> ParseV1ModelRoute(absl::string_view path, absl::string_view target) {
  using Kind = HttpRoute::Kind;
  HttpRoute route;
  absl::string_view verb;
  if (const size_t colon = path.rfind(':'); colon != absl::string_view::npos) {
    verb = path.substr(colon + 1);
    path = path.substr(0, colon);
  }
  if (absl::Status s = ParseModelPath(path, target, route); !s.ok()) return s;
  if (verb.empty()) {
    route.kind = Kind::kGetModel;
  } else if (verb == "classify" || verb == "tag") {
    route.kind = verb == "classify" ? Kind::kClassify : Kind::kTag;
  } else {
    return absl::NotFoundError(
        absl::StrCat("no route for ", target.substr(0, 200), ": the verbs are :classify and :tag"));
  }
  route.allow = route.kind == Kind::kGetModel ? "GET" : "POST";
  return route;
}

}  // namespace

absl::StatusOr<HttpRoute> ParseRoute(std::string_view method_sv, std::string_view target_sv) {
  using Kind = HttpRoute::Kind;
  const absl::string_view method(method_sv.data(), method_sv.size());
  const absl::string_view target(target_sv.data(), target_sv.size());
  const absl::string_view full_path = target.substr(0, target.find('?'));
  absl::string_view path = full_path;
  HttpRoute route;
  const auto want = [&](Kind kind, const char* allowed) -> absl::StatusOr<HttpRoute> {
    route.kind = kind;
    route.allow = allowed;
    if (method != absl::string_view(allowed)) {
      return absl::FailedPreconditionError(
          absl::StrCat("method ", method, " is not allowed on ", full_path, "; use ", allowed));
    }
    return route;
  };
  if (path == "/v2/health/live") return want(Kind::kLive, "GET");
  if (path == "/v2/health/ready") return want(Kind::kReady, "GET");
  if (path == "/v1/models") return want(Kind::kListModels, "GET");
  if (path == "/v2") return want(Kind::kServerMetadata, "GET");
  if (path == "/openapi.json") return want(Kind::kOpenApi, "GET");
  if (path == "/") return want(Kind::kPage, "GET");
  absl::StatusOr<HttpRoute> model = absl::NotFoundError(absl::StrCat("no route for ", target.substr(0, 200)));
  if (absl::ConsumePrefix(&path, "/v2/models/")) {
    model = ParseV2ModelRoute(path, target);
  } else if (absl::ConsumePrefix(&path, "/v1/models/")) {
    model = ParseV1ModelRoute(path, target);
  }
  if (!model.ok()) return model.status();
  route = *std::move(model);
  return want(route.kind, route.allow == "POST" ? "POST" : "GET");
}

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

bool HttpApi::CorsAllows(const std::string& origin) const {
  for (const std::string& allowed : options_.cors_origins) {
    if (allowed == "*" || allowed == origin) return true;
  }
  return false;
}

// A browser's preflight (OPTIONS with Origin and Access-Control-Request-Method) from an allowed
// origin: 204 with what it may send. From another origin: 403. Without Origin: the route's methods.
namespace {

// "GET, OPTIONS" or "POST, OPTIONS" for a path a route has (every route takes one method), or why none does.
absl::StatusOr<std::string> AllowedMethods(const std::string& target) {
  absl::StatusOr<HttpRoute> route = ParseRoute("GET", target);
  if (route.ok()) return std::string("GET, OPTIONS");
  if (route.status().code() == absl::StatusCode::kFailedPrecondition) return std::string("POST, OPTIONS");
  return route.status();
}

}  // namespace

HttpResponse HttpApi::Preflight(const HttpRequest& request) const {
  absl::StatusOr<std::string> allowed = AllowedMethods(request.target);
  if (!allowed.ok()) return ErrorResponse(allowed.status());
  const std::string& methods = *allowed;
  HttpResponse r{204, "application/json", "", {{"Allow", methods}}};
  const std::string origin = request.Header("Origin");
  if (origin.empty()) return r;
  if (!CorsAllows(origin)) {
    return JsonError(403, absl::StrCat("origin '", Clip(origin, 100), "' is not allowed (--http-cors-allow-origin)"));
  }
  const std::string asked = request.Header("Access-Control-Request-Headers");
  r.headers.emplace_back("Access-Control-Allow-Methods", methods);
  r.headers.emplace_back("Access-Control-Allow-Headers", asked.empty() ? "Content-Type, X-Request-Id" : asked);
  r.headers.emplace_back("Access-Control-Max-Age", "600");
  return r;
}

HttpServer::Reply HttpApi::WithCors(const HttpRequest& request, HttpServer::Reply reply) const {
  const std::string origin = request.Header("Origin");
  if (origin.empty() || !CorsAllows(origin)) return reply;
  const bool any =
      std::find(options_.cors_origins.begin(), options_.cors_origins.end(), "*") != options_.cors_origins.end();
  return [reply = std::move(reply), value = any ? std::string("*") : origin, any](HttpResponse r) {
    r.headers.emplace_back("Access-Control-Allow-Origin", value);
    r.headers.emplace_back("Access-Control-Expose-Headers", "X-Request-Id");
    if (!any) r.headers.emplace_back("Vary", "Origin");
    reply(std::move(r));
  };
}

// The routes that only read the server's state.
HttpResponse HttpApi::Describe(const HttpRoute& route) const {
  using Kind = HttpRoute::Kind;
  switch (route.kind) {
    case Kind::kLive:
      return HttpResponse{200, "application/json", R"({"live":true})", {}};
    case Kind::kReady:
      return serving_->load() ? HttpResponse{200, "application/json", R"({"ready":true})", {}}
                              : HttpResponse{503, "application/json", R"({"ready":false})", {}};
    case Kind::kListModels: {
      v1::ListModelsResponse out;
      for (const ModelStatus& m : repository_->List()) ToProto(m, out.add_models());
      absl::StatusOr<std::string> json = ToJson(out);
      return json.ok() ? HttpResponse{200, "application/json", *json, {}} : ErrorResponse(json.status());
    }
    case Kind::kGetModel: {
      v1::GetModelRequest in;
      in.mutable_model()->set_name(route.model);
      in.mutable_model()->set_version(route.version);
      v1::GetModelResponse out;
      if (absl::Status s = rpc_->GetModel(in, &out); !s.ok()) return ErrorResponse(s);
      absl::StatusOr<std::string> json = ToJson(out);
      return json.ok() ? HttpResponse{200, "application/json", *json, {}} : ErrorResponse(json.status());
    }
    case Kind::kOpenApi:
      return HttpResponse{200, "application/json", OpenApiDocument(), {}};
    case Kind::kPage:
      if (!options_.explain_page) {
        return ErrorResponse(absl::NotFoundError("no route for / (the explanation page is off: --http-explain-page)"));
      }
      return ExplainPageResponse();
    case Kind::kServerMetadata: {
      inference::ServerMetadataResponse out;
      OipServiceImpl::ServerMetadata(&out);
      out.add_extensions("binary_tensor_data");  // Triton's name for the binary-data extension (REST only)
      const nlohmann::json body = {
          {"name", out.name()},
          {"version", out.version()},
          {"extensions", std::vector<std::string>(out.extensions().begin(), out.extensions().end())}};
      return HttpResponse{200, "application/json", body.dump(), {}};
    }
    default:
      return ModelRoute(oip_, route);
  }
}

void HttpApi::Handle(HttpRequest request, HttpServer::Reply reply) {
  // CORS: an answer to an allowed origin says so (whichever thread writes it).
  reply = WithCors(request, std::move(reply));
  if (request.method == "OPTIONS") return reply(Preflight(request));
  absl::StatusOr<HttpRoute> route = ParseRoute(request.method, request.target);
  if (!route.ok()) {
    HttpResponse r = ErrorResponse(route.status());
    if (route.status().code() == absl::StatusCode::kFailedPrecondition) {
      r.status = 405;
      r.headers.emplace_back("Allow", AllowedMethods(request.target).value_or("GET, OPTIONS"));
    }
    return reply(std::move(r));
  }
  using Kind = HttpRoute::Kind;
  switch (route->kind) {
    case Kind::kClassify:
      return Serve<v1::ClassifyRequest, v1::ClassifyResponse>(core_, calls_, Method::kClassify, *route,
                                                              std::move(request), std::move(reply));
    case Kind::kTag:
      return Serve<v1::TagRequest, v1::TagResponse>(core_, calls_, Method::kTag, *route, std::move(request),
                                                    std::move(reply));
    case Kind::kInfer:
      return ServeInfer(core_, calls_, oip_, *route, std::move(request), std::move(reply));
    default:
      return reply(Describe(*route));
  }
}

}  // namespace qvi

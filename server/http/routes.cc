#include "server/http/routes.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "server/auth/rate_limit.h"

namespace qvi {

namespace {

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
  const bool shadow = verb.empty() && absl::ConsumeSuffix(&path, "/shadow");
  if (absl::Status s = ParseModelPath(path, target, route); !s.ok()) return s;
  if (shadow && route.version != 0) {
    return absl::NotFoundError(absl::StrCat("no route for ", target.substr(0, 200), ": a model's shadow is ",
                                            "/v1/models/{m}/shadow (it names both versions)"));
  }
  if (shadow) {
    route.kind = Kind::kGetShadow;
  } else if (verb.empty()) {
    route.kind = Kind::kGetModel;
  } else if (verb == "classify" || verb == "tag") {
    route.kind = verb == "classify" ? Kind::kClassify : Kind::kTag;
  } else {
    return absl::NotFoundError(
        absl::StrCat("no route for ", target.substr(0, 200), ": the verbs are :classify and :tag"));
  }
  route.allow = route.kind == Kind::kGetModel || route.kind == Kind::kGetShadow ? "GET" : "POST";
  return route;
}

// TEI's routes for a model the path names, with `path` after "/models/": {m} (POST: predict, as / is),
// {m}/predict, {m}/info, {m}/tokenize, {m}/decode.
absl::StatusOr<HttpRoute> ParseTeiModelRoute(absl::string_view path, absl::string_view target) {
  const size_t slash = path.find('/');
  const absl::string_view verb = slash == absl::string_view::npos ? "" : path.substr(slash + 1);
  using Kind = HttpRoute::Kind;
  static const auto* kVerbs = new std::vector<std::pair<absl::string_view, Kind>>{{"predict", Kind::kTeiPredict},
                                                                                  {"info", Kind::kTeiInfo},
                                                                                  {"tokenize", Kind::kTeiTokenize},
                                                                                  {"decode", Kind::kTeiDecode}};
  const auto known = std::find_if(kVerbs->begin(), kVerbs->end(), [&](const auto& v) { return v.first == verb; });
  if (slash == 0 || path.empty() || (slash != absl::string_view::npos && known == kVerbs->end())) {
    return absl::NotFoundError(absl::StrCat("no route for ", target.substr(0, 200),
                                            ": TEI's routes for a model are /models/{m}/predict, /models/{m}/info, "
                                            "/models/{m}/tokenize and /models/{m}/decode"));
  }
  HttpRoute route;
  route.model = std::string(path.substr(0, slash));
  route.kind = known == kVerbs->end() ? Kind::kTeiPredict : known->second;
  route.allow = verb == "info" ? "GET" : "POST";
  route.by_model_type = verb.empty();
  return route;
}

// OIP's repository extension for a model, with `path` after "/v2/repository/models/": {m}/load or {m}/unload;
// a model name holds no '/'.
absl::StatusOr<HttpRoute> ParseRepositoryModelRoute(absl::string_view path, absl::string_view target) {
  const size_t slash = path.find('/');
  const absl::string_view verb = slash == absl::string_view::npos ? "" : path.substr(slash + 1);
  if (slash == 0 || (verb != "load" && verb != "unload")) {
    return absl::NotFoundError(absl::StrCat("no route for ", target.substr(0, 200)));
  }
  HttpRoute route;
  route.model = std::string(path.substr(0, slash));
  route.kind = verb == "load" ? HttpRoute::Kind::kRepositoryLoad : HttpRoute::Kind::kRepositoryUnload;
  route.allow = "POST";
  return route;
}

// "/": the page (GET) and TEI's predict for a classifier (POST).
absl::StatusOr<HttpRoute> RootRoute(absl::string_view method) {
  if (method != "GET" && method != "POST") {
    return absl::FailedPreconditionError(
        absl::StrCat("method ", method, " is not allowed on /; use GET (the page) or POST (TEI's predict)"));
  }
  HttpRoute route;
  route.kind = method == "POST" ? HttpRoute::Kind::kTeiPredict : HttpRoute::Kind::kPage;
  route.allow = method == "POST" ? "POST" : "GET";
  route.by_model_type = method == "POST";
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
  // The paths of one route each (/ has two: the page, and TEI's predict for a classifier).
  static constexpr struct {
    const char* path;
    Kind kind;
    const char* method;
  } kFixed[] = {{"/v2/health/live", Kind::kLive, "GET"},
                {"/v2/health/ready", Kind::kReady, "GET"},
                {"/v1/models", Kind::kListModels, "GET"},
                {"/v2", Kind::kServerMetadata, "GET"},
                {"/openapi.json", Kind::kOpenApi, "GET"},
                {"/predict", Kind::kTeiPredict, "POST"},
                {"/info", Kind::kTeiInfo, "GET"},
                {"/tokenize", Kind::kTeiTokenize, "POST"},
                {"/decode", Kind::kTeiDecode, "POST"},
                {"/v2/repository/index", Kind::kRepositoryIndex, "POST"},
                {"/classify", Kind::kOpenAiClassify, "POST"},
                {"/pooling", Kind::kOpenAiPooling, "POST"},
                {"/v1/classify", Kind::kOpenAiClassify, "POST"}};
  for (const auto& fixed : kFixed) {
    if (path == fixed.path) return want(fixed.kind, fixed.method);
  }
  absl::StatusOr<HttpRoute> model = absl::NotFoundError(absl::StrCat("no route for ", target.substr(0, 200)));
  if (path == "/") {
    model = RootRoute(method);
  } else if (absl::ConsumePrefix(&path, "/models/")) {
    model = ParseTeiModelRoute(path, target);
  } else if (absl::ConsumePrefix(&path, "/v2/repository/models/")) {
    model = ParseRepositoryModelRoute(path, target);
  } else if (absl::ConsumePrefix(&path, "/v2/models/")) {
    model = ParseV2ModelRoute(path, target);
  } else if (absl::ConsumePrefix(&path, "/v1/models/")) {
    model = ParseV1ModelRoute(path, target);
  }
  if (!model.ok()) return model.status();
  route = *std::move(model);
  if (route.kind == Kind::kGetShadow) {  // read with GET, set by an admin with PUT, cleared with DELETE
    route.allow = "GET, PUT, DELETE";
    if (method == "PUT" || method == "DELETE") route.kind = method == "PUT" ? Kind::kSetShadow : Kind::kClearShadow;
    if (method == "GET" || method == "PUT" || method == "DELETE") return route;
    return absl::FailedPreconditionError(
        absl::StrCat("method ", method, " is not allowed on ", full_path, "; use GET, PUT or DELETE"));
  }
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

absl::StatusOr<std::string> AllowedMethods(const std::string& target) {
  absl::StatusOr<HttpRoute> get = ParseRoute("GET", target);
  absl::StatusOr<HttpRoute> post = ParseRoute("POST", target);
  std::string allowed;
  for (const char* method : {"GET", "POST", "PUT", "DELETE"}) {  // PUT and DELETE: a model's shadow candidate
    if (ParseRoute(method, target).ok()) absl::StrAppend(&allowed, method, ", ");
  }
  if (!allowed.empty()) return absl::StrCat(allowed, "OPTIONS");
  return get.status().code() == absl::StatusCode::kFailedPrecondition ? post.status() : get.status();
}

HttpResponse JsonError(int status, absl::string_view message) {
  return HttpResponse{
      status,
      "application/json",
      nlohmann::json{{"error", std::string(message)}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      {}};
}

HttpResponse ErrorResponse(const absl::Status& status) {
  HttpResponse r = JsonError(HttpStatus(status.code()), status.message());
  // RFC 6750: a 401 says which scheme the server wants.
  if (status.code() == absl::StatusCode::kUnauthenticated) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  // A rate limit's refusal says when the same call would pass (RFC 9110: whole seconds).
  if (std::optional<absl::Duration> after = RetryAfter(status)) {
    r.headers.emplace_back(
        "Retry-After", absl::StrCat(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(*after, absl::Seconds(1))))));
  }
  return r;
}

}  // namespace qvi

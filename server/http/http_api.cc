#include "server/http/http_api.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/http/explain_page.h"
#include "server/http/kserve/kserve_routes.h"
#include "server/http/kserve/repository_routes.h"
#include "server/http/native/json_body.h"
#include "server/http/native/native_routes.h"
#include "server/http/openai/classify_routes.h"
#include "server/http/openai/model_list.h"
#include "server/http/openai/pooling_routes.h"
#include "server/http/openapi.h"
#include "server/http/tei/tei_routes.h"
#include "server/http/tei/tokenize_routes.h"
#include "server/logging.h"

namespace qvi {

bool HttpApi::CorsAllows(const std::string& origin) const {
  for (const std::string& allowed : options_.cors_origins) {
    if (allowed == "*" || allowed == origin) return true;
  }
  return false;
}

// A browser's preflight (OPTIONS with Origin and Access-Control-Request-Method) from an allowed
// origin: 204 with what it may send. From another origin: 403. Without Origin: the route's methods.
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
  r.headers.emplace_back("Access-Control-Allow-Headers",
                         asked.empty() ? "Content-Type, X-Request-Id, Authorization" : asked);
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

namespace {

// A path no route has (404), or a method its route does not take (405, with Allow), in the path's form.
HttpResponse RouteRefusal(const absl::Status& why, const std::string& target,
                          HttpResponse (*refuse)(const absl::Status&)) {
  HttpResponse r = refuse(why);
  if (why.code() == absl::StatusCode::kFailedPrecondition) {
    r.status = 405;
    r.headers.emplace_back("Allow", AllowedMethods(target).value_or("GET, OPTIONS"));
    if (refuse == OpenAiError) r.body = OpenAiErrorBody(why.message(), "MethodNotAllowedError", 405);  // its code
  }
  return r;
}

// The form of an error on `target`'s path: the drop-in routes' protocols' own, else {"error"}.
HttpResponse (*ErrorFormOf(const std::string& target))(const absl::Status&) {
  if (IsTeiTarget(target)) return TeiError;
  if (IsOpenAiTarget(target)) return OpenAiError;
  return ErrorResponse;
}

}  // namespace

// The routes that only read the server's state.
HttpResponse HttpApi::Describe(const HttpRoute& route) const {
  using Kind = HttpRoute::Kind;
  switch (route.kind) {
    case Kind::kLive:
      return HttpResponse{200, "application/json", R"({"live":true})", {}};
    case Kind::kReady:
      return serving_->load() ? HttpResponse{200, "application/json", R"({"ready":true})", {}}
                              : HttpResponse{503, "application/json", R"({"ready":false})", {}};
    case Kind::kListModels:
      // The native listing and OpenAI's (vLLM's GET /v1/models) share the path: one body holds both.
      return WithOpenAiModelList(ListModelsRoute(*repository_), repository_->List());
    case Kind::kGetModel:
      return GetModelRoute(*repository_, *core_, route);
    case Kind::kGetShadow:
      return GetShadowRoute(*repository_, *core_, route);
    case Kind::kOpenApi:
      return HttpResponse{200, "application/json", OpenApiDocument(), {}};
    case Kind::kPage:
      if (!options_.explain_page) {
        return ErrorResponse(absl::NotFoundError("no route for / (the explanation page is off: --http-explain-page)"));
      }
      return ExplainPageResponse();
    case Kind::kServerMetadata:
      return KServeServerMetadata();
    default:
      return KServeModelRoute(oip_, route);
  }
}

void HttpApi::ServeDropIn(const HttpRoute& route, HttpRequest request, HttpServer::Reply reply) {
  using Kind = HttpRoute::Kind;
  switch (route.kind) {
    case Kind::kOpenAiPooling:
      return ServeOpenAiPooling(core_, calls_, *repository_, options_.default_model, std::move(request),
                                std::move(reply));
    case Kind::kOpenAiClassify:
      return ServeOpenAiClassify(core_, calls_, *repository_, options_.default_model, std::move(request),
                                 std::move(reply));
    case Kind::kTeiPredict:
      return ServeTeiPredict(core_, calls_, *repository_, options_.default_model, route, std::move(request),
                             std::move(reply));
    case Kind::kTeiInfo:
      // It names a model and its labels: the `read` scope, as GetModel (TEI's is public).
      if (absl::Status s = calls_->Authorize(request.Header("Authorization"), Scope::kRead); !s.ok()) {
        return reply(TeiError(s));
      }
      return reply(
          TeiInfoRoute(*repository_, core_->limits(), options_.default_model, options_.tokenization_workers, route));
    case Kind::kTeiTokenize:
    case Kind::kTeiDecode:
      return ServeTeiTokens(core_, calls_, *repository_, options_.default_model, route, std::move(request),
                            std::move(reply));
    default:
      return reply(TeiError(absl::InternalError("not a drop-in route")));
  }
}

// An admin's shadow candidate (PUT, DELETE /v1/models/{m}/shadow): the `admin` scope, as model control.
HttpResponse HttpApi::ChangeShadow(const HttpRoute& route, const HttpRequest& request) const {
  if (absl::Status s = calls_->Authorize(request.Header("Authorization"), Scope::kAdmin); !s.ok()) {
    return ErrorResponse(s);
  }
  if (options_.repository_control == nullptr) {
    return ErrorResponse(absl::UnimplementedError("this server has no model control"));
  }
  return SetShadowRoute(*options_.repository_control, *repository_, *core_, route, request.body);
}

void HttpApi::Handle(HttpRequest request, HttpServer::Reply reply) {
  // CORS: an answer to an allowed origin says so (whichever thread writes it).
  reply = WithCors(request, std::move(reply));
  if (request.method == "OPTIONS") return reply(Preflight(request));
  // The drop-in routes' paths refuse in their protocol's form, their routing's refusals too (404, 405).
  HttpResponse (*const refuse)(const absl::Status&) = ErrorFormOf(request.target);
  // Authorization is no list: HTTP allows it once. Two (a proxy that added its own beside the client's)
  // would let whichever came first decide; refused whatever the route, naming the header, not its values.
  if (request.HeaderCount("Authorization") > 1) {
    return reply(refuse(
        absl::InvalidArgumentError("the request carries the Authorization header more than once; send it once")));
  }
  absl::StatusOr<HttpRoute> route = ParseRoute(request.method, request.target);
  if (!route.ok()) return reply(RouteRefusal(route.status(), request.target, refuse));
  using Kind = HttpRoute::Kind;
  if (IsDropIn(route->kind)) return ServeDropIn(*route, std::move(request), std::move(reply));
  if (route->kind == Kind::kSetShadow || route->kind == Kind::kClearShadow) return reply(ChangeShadow(*route, request));
  switch (route->kind) {
    case Kind::kListModels:
    case Kind::kGetModel:
    case Kind::kGetShadow:
    case Kind::kServerMetadata:
    case Kind::kModelMetadata:
      // What the models are: the `read` scope with --api-keys. The probes (live, ready, a model's
      // ready), the OpenAPI document and the page need no key; the page asks for one (explain_page).
      if (absl::Status s = calls_->Authorize(request.Header("Authorization"), Scope::kRead); !s.ok()) {
        return reply(ErrorResponse(s));
      }
      return reply(Describe(*route));
    case Kind::kClassify:
    case Kind::kTag:
      return ServeNativeInfer(core_, calls_, *route, std::move(request), std::move(reply));
    case Kind::kInfer:
      return ServeKServeInfer(core_, calls_, oip_, *route, std::move(request), std::move(reply));
    case Kind::kRepositoryIndex:
    case Kind::kRepositoryLoad:
    case Kind::kRepositoryUnload:
      if (options_.repository_control == nullptr) {
        return reply(ErrorResponse(absl::UnimplementedError("this server has no model control")));
      }
      return ServeRepository(options_.repository_control, calls_, *route, request, std::move(reply));
    default:
      return reply(Describe(*route));
  }
}

}  // namespace qvi

// What the HTTP port answers (docs/serving.md, "HTTP/JSON"): the same core, limits, metrics and
// access log as gRPC, in JSON.
//   GET  /v2/health/live, /v2/health/ready         Kubernetes probes (KServe v2's health routes)
//   GET  /v1/models                                 ListModels, in protobuf's JSON mapping
//   GET  /v1/models/{m}[/versions/{v}]              GetModel
//   POST /v1/models/{m}[/versions/{v}]:classify     Classify: the body is a ClassifyRequest in
//   POST /v1/models/{m}[/versions/{v}]:tag          protobuf's JSON (what grpcurl -d takes), the model
//                                                   from the path; the answer a ClassifyResponse
//   GET  /v2                                        KServe v2 REST (kserve_rest.h): server metadata,
//   GET  /v2/models/{m}[/versions/{v}][/ready]      model metadata and readiness,
//   POST /v2/models/{m}[/versions/{v}]/infer        inference with JSON tensors, as OIP over gRPC
//   GET  /openapi.json                              this list as an OpenAPI 3.1 document
//   GET  /                                          the explanation page (explain_page.h), unless off
// Errors are {"error": "..."} with the HTTP status of the gRPC code (HttpStatus). With TLS the port is
// HTTPS only (http_server.h).
#ifndef QVI_SERVER_HTTP_HTTP_API_H_
#define QVI_SERVER_HTTP_HTTP_API_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/serving/inference_service.h"
#include "server/core/serving/model_repository.h"
#include "server/grpc/infer_call.h"
#include "server/grpc/inference_service_impl.h"
#include "server/grpc/oip_service.h"
#include "server/http/http_server.h"
#include "server/http/openapi.h"  // OpenApiDocument(): GET /openapi.json

namespace qvi {

// A request's route, from its method and target alone.
struct HttpRoute {
  enum class Kind {
    kLive,
    kReady,
    kListModels,
    kGetModel,
    kClassify,
    kTag,
    kServerMetadata,
    kModelMetadata,
    kModelReady,
    kInfer,
    kOpenApi,
    kPage
  };
  Kind kind = Kind::kLive;
  std::string model;    // kGetModel, kClassify, kTag
  int64_t version = 0;  // 0: the version policy's choice
  std::string allow;    // the methods the path takes ("GET", "POST")
};

// The route of `target` (its query ignored): NOT_FOUND for a path no route has, FAILED_PRECONDITION
// (answered 405 with Allow) for a known path with another method, INVALID_ARGUMENT for a bad version.
absl::StatusOr<HttpRoute> ParseRoute(std::string_view method, std::string_view target);

// The HTTP status of a gRPC/absl code (google.api's mapping: NOT_FOUND 404, RESOURCE_EXHAUSTED 429,
// UNAVAILABLE 503, DEADLINE_EXCEEDED 504, CANCELLED 499, ...).
int HttpStatus(absl::StatusCode code);

class HttpApi {
 public:
  // `serving` is the server's readiness (false from the start of a drain); `rpc` answers GetModel,
  // `oip` plans and answers KServe v2's routes as it does OIP's gRPC calls.
  struct Options {
    // The origins a browser may call from ("*": any); none: no CORS headers, and preflights from any
    // origin are refused.
    std::vector<std::string> cors_origins;
    // GET / answers the explanation page; off, it is 404 like any unknown path.
    bool explain_page = true;
  };
  HttpApi(InferenceService* core, const ModelRepository* repository, InferCalls* calls, const InferenceServiceImpl* rpc,
          const OipServiceImpl* oip, const std::atomic<bool>* serving, Options options)
      : core_(core),
        repository_(repository),
        calls_(calls),
        rpc_(rpc),
        oip_(oip),
        serving_(serving),
        options_(std::move(options)) {}

  void Handle(HttpRequest request, HttpServer::Reply reply);

 private:
  bool CorsAllows(const std::string& origin) const;
  HttpResponse Preflight(const HttpRequest& request) const;
  // `reply`, adding the CORS headers when the request's origin is allowed.
  HttpServer::Reply WithCors(const HttpRequest& request, HttpServer::Reply reply) const;
  HttpResponse Describe(const HttpRoute& route) const;

  InferenceService* core_;
  const ModelRepository* repository_;
  InferCalls* calls_;
  const InferenceServiceImpl* rpc_;
  const OipServiceImpl* oip_;
  const std::atomic<bool>* serving_;
  const Options options_;
};

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_HTTP_API_H_

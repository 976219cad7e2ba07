// The HTTP port's routes (docs/serving.md, "HTTP/JSON"), from a request's method and target alone, and
// the HTTP status and body of an error. The list of routes: http_api.h.
#ifndef QVI_SERVER_HTTP_ROUTES_H_
#define QVI_SERVER_HTTP_ROUTES_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/http/http_server.h"

namespace qvi {

// A request's route, from its method and target alone.
struct HttpRoute {
  enum class Kind {
    kLive,
    kReady,
    kListModels,
    kGetModel,
    kGetShadow,    // GET /v1/models/{m}/shadow
    kSetShadow,    // PUT /v1/models/{m}/shadow (an admin's candidate)
    kClearShadow,  // DELETE /v1/models/{m}/shadow
    kClassify,
    kTag,
    kServerMetadata,
    kModelMetadata,
    kModelReady,
    kInfer,
    kOpenApi,
    kPage,
    kTeiPredict,      // TEI's (tei/tei_routes.h): POST /predict, POST /, POST /models/{m}[/predict]
    kTeiInfo,         // GET /info, /models/{m}/info
    kTeiTokenize,     // POST /tokenize, /models/{m}/tokenize (tei/tokenize_routes.h)
    kTeiDecode,       // POST /decode, /models/{m}/decode
    kOpenAiClassify,  // POST /classify, /v1/classify (openai/classify_routes.h)
    kOpenAiPooling,   // POST /pooling (openai/pooling_routes.h)
    kRepositoryIndex,
    kRepositoryLoad,
    kRepositoryUnload
  };
  Kind kind = Kind::kLive;
  std::string model;    // kGetModel, kClassify, kTag; kTei*: "" when the path names none
  int64_t version = 0;  // 0: the version policy's choice
  std::string allow;    // the methods the path takes ("GET", "POST")
  // kTeiPredict on POST / and /models/{m}: answered as the model is, as TEI does (a tagger: Hugging Face's
  // token-classification pipeline, hf/pipeline_routes.h); /predict classifies.
  bool by_model_type = false;
};

// TEI's routes and OpenAI-style /classify: their own error forms, the model chosen as drop_in.h says.
inline bool IsDropIn(HttpRoute::Kind kind) {
  using Kind = HttpRoute::Kind;
  return kind == Kind::kOpenAiClassify || kind == Kind::kOpenAiPooling || kind == Kind::kTeiPredict ||
         kind == Kind::kTeiInfo || kind == Kind::kTeiTokenize || kind == Kind::kTeiDecode;
}

// The route of `target` (its query ignored): NOT_FOUND for a path no route has, FAILED_PRECONDITION
// (answered 405 with Allow) for a known path with another method, INVALID_ARGUMENT for a bad version.
absl::StatusOr<HttpRoute> ParseRoute(std::string_view method, std::string_view target);

// The HTTP status of a gRPC/absl code (google.api's mapping: NOT_FOUND 404, RESOURCE_EXHAUSTED 429,
// UNAVAILABLE 503, DEADLINE_EXCEEDED 504, CANCELLED 499, ...).
int HttpStatus(absl::StatusCode code);

// "GET, OPTIONS", "POST, OPTIONS" or "GET, POST, OPTIONS" (/: the page, and TEI's predict) for a path
// a route has, or why none does.
absl::StatusOr<std::string> AllowedMethods(const std::string& target);

// {"error": "..."} with `status`; ErrorResponse: with the HTTP status of the status's code.
HttpResponse JsonError(int status, absl::string_view message);
HttpResponse ErrorResponse(const absl::Status& status);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_ROUTES_H_

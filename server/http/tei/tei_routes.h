// Text Embeddings Inference's routes on the HTTP port (docs/serving.md, "Drop-in routes"), so that a client
// written for TEI, or Hugging Face's InferenceClient, calls a classifier here unchanged:
//   POST /predict, POST / (TEI answers / with predict for a classifier), POST /models/{m}[/predict]
//        {"inputs": "text" | ["text"] | [["text"], ["text"], ...], "truncate": bool, "raw_scores": false,
//         "parameters": {"top_k": K, "function_to_apply": "softmax"}}  (parameters: InferenceClient's)
//        -> every label with its score, best first: [{"score", "label"}, ...] for one text, a list of those for
//           a batch; with "parameters" (InferenceClient's text_classification) always a list of lists, each
//           cut to top_k.
//   GET  /info, /models/{m}/info   TEI's Info: the model, its labels (model_type.classifier), its limits.
// The model: the path's; else --default-model; else the store's only model (several: an error naming both
// ways). Every call runs through the one call layer (server/frontend/call.h): API keys (Authorization: Bearer,
// as TEI's), limits, priorities, deadlines, the response cache, metrics (method "Predict") and traces. Errors
// are TEI's {"error": "...", "error_type": "Validation" | "Overloaded" | "Unhealthy" | "Backend" | "Empty"}
// with TEI's status codes (TeiError).
//
// POST / and POST /models/{m} answer by what the model is, as TEI's do: a tagger answers Hugging Face's
// token-classification pipeline shape (hf/pipeline_routes.h; a tagger not loaded yet, under load on demand, is
// taken for a classifier and refused as one).
// Not built yet (docs/serving.md says so): raw_scores (TEI answers logits; refused), text pairs, left
// truncation. TEI's gRPC service: server/grpc/tei/tei_service.h. /tokenize and /decode: tokenize_routes.h. "explain":
// true adds the top prediction's "explanation" (drop_in.h's Explanation).
#ifndef QVI_SERVER_HTTP_TEI_TEI_ROUTES_H_
#define QVI_SERVER_HTTP_TEI_TEI_ROUTES_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/repository/model_repository.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/http/drop_in_bodies.h"
#include "server/http/http_server.h"
#include "server/http/routes.h"

namespace qvi {

// Whether `target` is one of TEI's paths (/predict, /info, /models/...), whose refusals, routing's included
// (404, 405), take TEI's form.
bool IsTeiTarget(std::string_view target);

// The model a TEI route answers from: `route.model`, else `default_model`, else the store's only model (the
// refusal names /models/{m}/<verb>).
absl::StatusOr<std::string> TeiModel(const HttpRoute& route, const std::string& default_model,
                                     const ModelRepository& repository, const char* verb = "predict");

// TEI's error body and status for `status`: INVALID_ARGUMENT and the like are 422 "Validation" (an empty text:
// 400 "Empty"), RESOURCE_EXHAUSTED 429 "Overloaded", UNAVAILABLE 503 "Unhealthy", NOT_FOUND 404, others
// "Backend" with their HTTP status (ErrorResponse's headers kept: WWW-Authenticate, Retry-After).
HttpResponse TeiError(const absl::Status& status);

void ServeTeiPredict(Core* core, Calls* calls, const ModelRepository& repository, const std::string& default_model,
                     const HttpRoute& route, HttpRequest request, HttpServer::Reply reply);
// GET /info: `tokenization_workers` the threads that tokenise (--inference-threads).
HttpResponse TeiInfoRoute(const ModelRepository& repository, const RequestLimits& limits,
                          const std::string& default_model, int tokenization_workers, const HttpRoute& route);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_TEI_TEI_ROUTES_H_

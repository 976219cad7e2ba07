// OpenAI-style classification as vLLM serves it (docs/serving.md, "Drop-in routes"), so that a client written
// for vLLM's (or Dynamo's) /classify calls a classifier here unchanged:
//   POST /classify, /v1/classify
//        {"model": "m" (optional), "input": "text" | ["text", ...]}
//        -> {"id": "classify-<request id>", "object": "list", "created": <unix seconds>, "model": "m",
//            "data": [{"index": 0, "label": top label, "probs": [every label's, in the model's label order],
//                      "num_classes": N}],
//            "usage": {"prompt_tokens": T, "total_tokens": T, "completion_tokens": 0,
//                      "completion_tokens_details": null}}
// The model: the body's; else --default-model; else the store's only model. Through the one call layer (keys,
// limits, priorities, deadlines, the response cache, metrics as method "OpenAiClassify", traces). Errors are
// OpenAI's {"error": {"message", "type", "param", "code"}} (OpenAiError).
//
// "explain": true adds each data item's "explanation" (drop_in.h's Explanation).
// Not built yet: token ids as input, use_activation: false (logits), truncate_prompt_tokens (refused, naming the
// field); the chat form (messages); /pooling's token_classify.
#ifndef QVI_SERVER_HTTP_OPENAI_CLASSIFY_ROUTES_H_
#define QVI_SERVER_HTTP_OPENAI_CLASSIFY_ROUTES_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/repository/model_repository.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/http/drop_in_bodies.h"
#include "server/http/http_server.h"
#include "server/http/routes.h"

namespace qvi {

// Whether `target` is /classify or /v1/classify, whose refusals, routing's included, take OpenAI's form.
bool IsOpenAiTarget(std::string_view target);

// OpenAI's error body: INVALID_ARGUMENT and the like 400 "BadRequestError", NOT_FOUND 404 "NotFoundError",
// UNAUTHENTICATED 401 "AuthenticationError", PERMISSION_DENIED 403 "PermissionDeniedError", RESOURCE_EXHAUSTED 429
// "RateLimitError", UNAVAILABLE 503 "ServiceUnavailableError", others 500 "InternalServerError"; `code` the HTTP
// status (ErrorResponse's headers kept).
HttpResponse OpenAiError(const absl::Status& status);
// That body with another HTTP status (a routing refusal's 405).
std::string OpenAiErrorBody(absl::string_view message, const char* type, int code);

void ServeOpenAiClassify(Core* core, Calls* calls, const ModelRepository& repository, const std::string& default_model,
                         HttpRequest request, HttpServer::Reply reply);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_OPENAI_CLASSIFY_ROUTES_H_

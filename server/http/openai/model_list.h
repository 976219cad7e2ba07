// OpenAI's model list (GET /v1/models as vLLM answers it; docs/serving.md, "Drop-in routes") on the path the
// native ListModels already holds. The one answer serves both: the native body ({"models": [...]}) gains
// OpenAI's {"object": "list", "data": [{"id", "object": "model", "created", "owned_by", "root", "parent",
// "max_model_len"}]} beside it, fields each kind of client ignores of the other's. `data` lists the models a
// request can reach now (a READY version), as vLLM lists what it serves: "id" the name, "root" the newest
// ready version's model id (its manifest's name), "max_model_len" its tokenizer's max_tokens, "created" the
// answer's time (vLLM's too). vLLM's deprecated "permission" is left out.
#ifndef QVI_SERVER_HTTP_OPENAI_MODEL_LIST_H_
#define QVI_SERVER_HTTP_OPENAI_MODEL_LIST_H_

#include <vector>

#include "nlohmann/json.hpp"
#include "server/core/repository/repository_types.h"
#include "server/http/http_server.h"

namespace qvi {

// OpenAI's `data` for `models` (ModelRepository::List's order), at the Unix time `created`.
nlohmann::ordered_json OpenAiModelCards(const std::vector<ModelStatus>& models, int64_t created);

// The native ListModels answer `native` with OpenAI's fields added; any other answer (an error) unchanged.
HttpResponse WithOpenAiModelList(HttpResponse native, const std::vector<ModelStatus>& models);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_OPENAI_MODEL_LIST_H_

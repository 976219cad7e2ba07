// vLLM's POST /pooling (docs/serving.md, "Drop-in routes"), for the two tasks these models answer:
//   {"model": "ner", "input": "text" | ["text", ...], "task": "token_classify" | "classify"}
//   -> vLLM's PoolingResponse: {"id": "pooling-<request id>", "object": "list", "created", "model",
//      "data": [{"index", "object": "pooling", "data": ...}], "usage"} where a token_classify item's data is each
//      word's probability of every tag ([words][tags], the CRF's marginals, calibrated as the entities' scores)
//      and a classify item's every label's probability; QVI's additions, which vLLM's clients ignore: "labels"
//      (the columns' names), each token_classify item's "words" ({"text", "start", "end", "tag"}, characters) and
//      "entities" (Hugging Face's entity_group/score/word/start/end); on request ("explain": true) a classify
//      item's "explanation", or each entity's (drop_in.h's HfEntities).
// No "task": the model's (a tagger's token_classify, a classifier's classify). vLLM answers one row per prompt
// token, special tokens included; here a row is a word, as every answer of this server is (a sub-word model's
// words are its pre-tokenizer's pieces). Errors take OpenAI's form (classify_routes.h); metrics "OpenAiPooling".
#ifndef QVI_SERVER_HTTP_OPENAI_POOLING_ROUTES_H_
#define QVI_SERVER_HTTP_OPENAI_POOLING_ROUTES_H_

#include <string>

#include "server/core/repository/model_repository.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/http/http_server.h"

namespace qvi {

void ServeOpenAiPooling(Core* core, Calls* calls, const ModelRepository& repository, const std::string& default_model,
                        HttpRequest request, HttpServer::Reply reply);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_OPENAI_POOLING_ROUTES_H_

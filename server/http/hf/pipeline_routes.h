// Hugging Face's token-classification pipeline shape on TEI's model-typed routes (POST / and POST /models/{m}:
// TEI answers them by what the model is, so a tagger answers them here as the pipeline does), so that
// huggingface_hub's InferenceClient(base_url=...).token_classification(text) calls a tagger here unchanged:
//   {"inputs": "text" | ["text", ...], "parameters": {"aggregation_strategy": "simple" | "first",
//    "ignore_labels": ["O", ...]}}
//   -> [{"entity_group": "PER", "score": 0.99, "word": "Jessica", "start": 0, "end": 7}, ...] for one text
//      (start, end: characters, i.e. Unicode code points, as Python counts them), a list of those per text
//      for a list of texts.
// The entities are the tagger's spans (its CRF over each word's first sub-word: the pipeline's "first"; "simple"
// groups the same tags into the same entities, as a word's sub-words never disagree here), each with its one
// calibrated confidence. "none" (a row per sub-word, its own softmax), "average" and "max" (word scores fused
// from sub-word scores) and "stride" (windows over a long text) describe scores this tagger does not compute:
// refused, naming the field. Errors take TEI's form (tei_routes.h), as the routes' other answers do.
// QVI's addition, which the pipeline's clients ignore: "explain": true in the body gives each entity an
// "explanation" (drop_in.h's HfEntities: the words, α and β where the model has them, and the entity's occlusion).
#ifndef QVI_SERVER_HTTP_HF_PIPELINE_ROUTES_H_
#define QVI_SERVER_HTTP_HF_PIPELINE_ROUTES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/repository/model_repository.h"
#include "server/frontend/core.h"
#include "server/http/drop_in_bodies.h"
#include "server/http/http_call.h"

namespace qvi {

// Answers `call` (admitted, for `model`, a tagger) with the tagger's entities in the pipeline's shape.
void ServeTokenClassification(Core* core, const ModelRepository& repository, std::shared_ptr<HttpCall> call,
                              const std::string& model, HttpRequest request);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_HF_PIPELINE_ROUTES_H_

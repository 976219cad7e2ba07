// What the drop-in routes share (TEI's in tei/, OpenAI-style /classify in openai/; docs/serving.md, "Drop-in
// routes"): which model answers, and how a score is written.
#ifndef QVI_SERVER_HTTP_DROP_IN_H_
#define QVI_SERVER_HTTP_DROP_IN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/core/outputs/answer.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request.h"
#include "server/frontend/drop_in_model.h"

namespace qvi {

// What "explain": true asks of a classifier (QVI's addition to the drop-in shapes): the words with α, β and
// every returned label's exact contributions — each that `model`'s outputs have (a model not loaded yet: α and
// the contributions, which the zoo's attention-pooling classifiers answer).
void AskExplanations(const ModelRepository& repository, const std::string& model, OutputOptions& options);

// What "explain": true asks of a tagger: AskExplanations' (the words, with α and β where the model has them) and
// occlusion — each entity's probability without each word of its text, the one explanation of an entity there is
// (it costs a forward pass a word: bounded by --max-occlusion-tokens).
void AskEntityExplanations(const ModelRepository& repository, const std::string& model, OutputOptions& options);

// A text's entities in Hugging Face's token-classification pipeline shape: [{"entity_group", "score", "word",
// "start", "end"}, ...] (characters), leaving out the types in `ignore`; with `explain`, each entity's
// "explanation": Explanation(result)'s words, α and β, and "occlusion": its probability's drop without each word
// (0 on its own words).
nlohmann::ordered_json HfEntities(const TextResult& result, const std::vector<std::string>& ignore, bool explain);

// A text's explanation as the drop-in answers carry it: {"words": [{"text", "start", "end"}, ...] (characters),
// "alpha": [...], "beta": [...], "contributions": {label: [one per word], ...}}, each key only when answered.
nlohmann::ordered_json Explanation(const TextResult& result);

// A classifier's answer's probabilities in the model's label order (`labels`), 0 for a label the answer left
// out, each written shortest: vLLM's `probs` and /pooling's classify data.
nlohmann::ordered_json ProbabilitiesInOrder(const TextResult& result, const std::vector<std::string>& labels);

// vLLM's list envelope of an answer: {"id": "<prefix>-<request id>", "object": "list", "created", "model",
// "data", "usage"}.
nlohmann::ordered_json OpenAiList(const char* prefix, const InferenceResponse& answer, nlohmann::ordered_json data);

// A float score as the double of the shortest decimal that reads back as it, so that JSON shows 0.98, not
// 0.9800000190734863 (as TEI and vLLM write their f32 scores).
double ShortestDouble(float v);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_DROP_IN_H_

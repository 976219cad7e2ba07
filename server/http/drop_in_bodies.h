// The drop-in routes' request bodies (docs/serving.md, "Drop-in routes"), decoded and checked before any model
// is resolved or anything is built from them: each body scanned first (json_body.h: malformed JSON named by byte,
// invalid UTF-8, nesting, a bounded count of values), then read, every refusal INVALID_ARGUMENT naming the field.
// Torch-free (nlohmann and json_body alone), so that the fuzz target fuzz_drop_in builds them alone; the routes
// that answer them are in tei/, hf/ and openai/.
#ifndef QVI_SERVER_HTTP_DROP_IN_BODIES_H_
#define QVI_SERVER_HTTP_DROP_IN_BODIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qvi {

// Whether a refusal is TEI's "Empty" (400, not 422): its message is TEI's own, "Input validation error:
// `inputs` cannot be empty" (/decode's: `input_ids`).
bool IsTeiEmptyRefusal(absl::string_view message);

// TEI's /predict (tei/tei_routes.h).
// A predict body, decoded and checked (before any model is resolved): errors name the field.
struct TeiPredict {
  std::vector<std::string> texts;
  bool batch = false;              // "inputs" was a list of lists: the answer is a list per text
  bool nested = false;             // "parameters" present (InferenceClient): a list of lists, whatever the inputs
  int top_k = 0;                   // parameters.top_k; 0: every label
  bool refuse_truncation = false;  // "truncate": false
  bool explain = false;            // "explain": true (QVI's addition: the top prediction's "explanation")
};
absl::StatusOr<TeiPredict> ParseTeiPredict(const std::string& body, int max_texts);

// TEI's /tokenize and /decode (tei/tokenize_routes.h).
struct TeiTokenize {
  std::vector<std::string> texts;
  bool add_special_tokens = true;
};
// Errors name the field; a text over `max_text_bytes` is refused.
absl::StatusOr<TeiTokenize> ParseTeiTokenize(const std::string& body, int max_texts, int max_text_bytes);

struct TeiDecode {
  std::vector<std::vector<int64_t>> ids;
  bool batch = false;  // "ids" was a list of lists
  bool skip_special_tokens = true;
};
// At most `max_texts` lists of ids, and 128 ids a list on average (ScanBody's bound on the values); an id is a
// whole number below 2^32 (TEI's are u32).
absl::StatusOr<TeiDecode> ParseTeiDecode(const std::string& body, int max_texts);

// Hugging Face's token classification (hf/pipeline_routes.h).
// A token-classification body, decoded and checked: errors name the field.
struct TokenClassification {
  std::vector<std::string> texts;
  bool batch = false;               // "inputs" was a list: a list of entities per text
  std::vector<std::string> ignore;  // parameters.ignore_labels: entity types left out ("O" is never one)
  bool explain = false;             // "explain": true (QVI's addition: each entity's "explanation")
};
absl::StatusOr<TokenClassification> ParseTokenClassification(const std::string& body, int max_texts);

// vLLM's /classify (openai/classify_routes.h).
// A /classify body, decoded and checked before any model is resolved: errors name the field.
struct OpenAiClassify {
  std::string model;  // "": none named
  std::vector<std::string> texts;
  bool explain = false;  // "explain": true (QVI's addition: each data item's "explanation")
};
absl::StatusOr<OpenAiClassify> ParseOpenAiClassify(const std::string& body, int max_texts);

// vLLM's /pooling (openai/classify_routes.h): /classify's body and a task.
struct OpenAiPooling {
  OpenAiClassify request;
  std::string task;  // "token_classify" or "classify"; "": the model's (a tagger's token_classify)
};
absl::StatusOr<OpenAiPooling> ParseOpenAiPooling(const std::string& body, int max_texts);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_DROP_IN_BODIES_H_

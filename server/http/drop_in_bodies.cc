#include "server/http/drop_in_bodies.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/native/json_body.h"

namespace qvi {
namespace {

using json = nlohmann::json;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// An empty text is TEI's "Empty" error (400), told apart from other refusals by its message, TEI's own
// (IsTeiEmptyRefusal).
constexpr char kEmpty[] = "Input validation error: `inputs` cannot be empty";

// -- TEI's /predict -------------------------------------------------------------------------------------------
// "inputs": a text, a list of one text, or a batch: a list of lists of one text each. A list of two texts
// (TEI's text pair, for cross-encoders) is refused: these models read one text.
absl::Status ReadInputs(const json& inputs, int max_texts, TeiPredict& out) {
  auto text = [&out](const json& v, const std::string& field) -> absl::Status {
    if (!v.is_string()) return Invalid(absl::StrCat(field, ": not a text"));
    if (v.get_ref<const std::string&>().empty()) return Invalid(kEmpty);
    out.texts.push_back(v.get<std::string>());
    return absl::OkStatus();
  };
  auto one = [&text](const json& list, const std::string& field) -> absl::Status {
    if (list.size() == 2 && list[0].is_string() && list[1].is_string()) {
      return Invalid(absl::StrCat(field, ": a pair of texts; these models classify one text (a list of one)"));
    }
    if (list.size() != 1) return Invalid(absl::StrCat(field, ": a list of ", list.size(), " items; give one text"));
    return text(list[0], absl::StrCat(field, "[0]"));
  };
  if (inputs.is_string()) return text(inputs, "inputs");
  if (!inputs.is_array()) return Invalid("inputs: a text, a list of one text, or a list of such lists");
  if (inputs.empty()) return Invalid(kEmpty);
  if (!inputs[0].is_array()) return one(inputs, "inputs");
  if (static_cast<int64_t>(inputs.size()) > max_texts) {
    return Invalid(absl::StrCat("batch size ", inputs.size(), " > maximum allowed batch size ", max_texts,
                                " (--max-texts-per-request)"));
  }
  out.batch = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string field = absl::StrCat("inputs[", i, "]");
    if (!inputs[i].is_array())
      return Invalid(absl::StrCat(field, ": a batch holds lists of one text; this is not one"));
    if (absl::Status s = one(inputs[i], field); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// InferenceClient's "parameters" (text_classification's): top_k, and the softmax the scores already are.
absl::Status ReadParameters(const json& p, TeiPredict& out) {
  if (!p.is_object()) return Invalid("parameters: not an object");
  out.nested = true;
  if (p.contains("top_k") && !p["top_k"].is_null()) {
    const json& k = p["top_k"];
    if (!k.is_number_unsigned() || k.get<uint64_t>() < 1) {
      return Invalid("parameters.top_k: not a whole number of labels of at least 1");
    }
    out.top_k = static_cast<int>(std::min<uint64_t>(k.get<uint64_t>(), 1 << 20));  // past every label: all
  }
  if (p.contains("function_to_apply") && !p["function_to_apply"].is_null() && p["function_to_apply"] != "softmax") {
    return Invalid(
        "parameters.function_to_apply: only \"softmax\" (the scores are the model's calibrated "
        "probabilities; \"sigmoid\" and \"none\" are not answered here)");
  }
  return absl::OkStatus();
}

// -- TEI's /tokenize and /decode -------------------------------------------------------------------------------
// The values a /decode body may hold: ScanBody's bound for this many "texts" (4 values each), 128 ids a list.
constexpr int kIdsPerText = 32;

absl::Status ReadText(const json& v, const std::string& field, int max_text_bytes, std::vector<std::string>& out) {
  if (!v.is_string()) return Invalid(absl::StrCat(field, ": not a text"));
  const std::string& text = v.get_ref<const std::string&>();
  if (text.empty()) return Invalid(kEmpty);
  if (static_cast<int64_t>(text.size()) > max_text_bytes) {
    return Invalid(
        absl::StrCat(field, ": ", text.size(), " bytes, over the limit of ", max_text_bytes, " (--max-text-bytes)"));
  }
  out.push_back(text);
  return absl::OkStatus();
}

absl::Status ReadFlag(const json& j, const char* key, bool& out) {
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  if (!j[key].is_boolean()) return Invalid(absl::StrCat(key, ": not true or false"));
  out = j[key].get<bool>();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ReadIds(const json& list, const std::string& field) {
  if (list.empty()) return Invalid("Input validation error: `input_ids` cannot be empty");
  std::vector<int64_t> ids;
  ids.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_number_unsigned() || list[i].get<uint64_t>() > UINT32_MAX) {
      return Invalid(absl::StrCat(field, "[", i, "]: not a token id (a whole number from 0)"));
    }
    ids.push_back(static_cast<int64_t>(list[i].get<uint64_t>()));
  }
  return ids;
}

// -- Hugging Face's token classification -----------------------------------------------------------------------

absl::Status ReadInputs(const json& inputs, int max_texts, TokenClassification& out) {
  auto text = [&out](const json& v, const std::string& field) -> absl::Status {
    if (!v.is_string()) return Invalid(absl::StrCat(field, ": not a text"));
    if (v.get_ref<const std::string&>().empty()) return Invalid(kEmpty);
    out.texts.push_back(v.get<std::string>());
    return absl::OkStatus();
  };
  if (inputs.is_string()) return text(inputs, "inputs");
  if (!inputs.is_array()) return Invalid("inputs: a text or a list of texts");
  if (inputs.empty()) return Invalid(kEmpty);
  if (static_cast<int64_t>(inputs.size()) > max_texts) {
    return Invalid(absl::StrCat("batch size ", inputs.size(), " > maximum allowed batch size ", max_texts,
                                " (--max-texts-per-request)"));
  }
  out.batch = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (absl::Status s = text(inputs[i], absl::StrCat("inputs[", i, "]")); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReadParameters(const json& p, TokenClassification& out) {
  if (!p.is_object()) return Invalid("parameters: not an object");
  if (p.contains("aggregation_strategy") && !p["aggregation_strategy"].is_null()) {
    // transformers reads the name in any case (AggregationStrategy[name.upper()]).
    const std::string a = p["aggregation_strategy"].is_string()
                              ? absl::AsciiStrToLower(p["aggregation_strategy"].get<std::string>())
                              : "";
    if (a != "simple" && a != "first") {
      return Invalid(
          "parameters.aggregation_strategy: \"simple\" or \"first\" (the tagger labels whole words from their "
          "first sub-word; \"none\", \"average\" and \"max\" need sub-word scores it does not compute)");
    }
  }
  if (p.contains("stride") && !p["stride"].is_null()) {
    return Invalid("parameters.stride: not read here; a text is cut at the model's max_tokens (truncated)");
  }
  if (p.contains("ignore_labels") && !p["ignore_labels"].is_null()) {
    const json& ignore = p["ignore_labels"];
    if (!ignore.is_array()) return Invalid("parameters.ignore_labels: not a list of labels");
    for (size_t i = 0; i < ignore.size(); ++i) {
      if (!ignore[i].is_string()) return Invalid(absl::StrCat("parameters.ignore_labels[", i, "]: not a label"));
      out.ignore.push_back(ignore[i].get<std::string>());
    }
  }
  return absl::OkStatus();
}

// -- vLLM's /classify ------------------------------------------------------------------------------------------
// Fields vLLM reads that would change the answer and are not answered here: refused, not ignored.
absl::Status CheckUnanswered(const nlohmann::json& j) {
  if (j.contains("use_activation") && j["use_activation"] == false) {
    return Invalid("use_activation: false asks for logits, which are not answered here (only probabilities)");
  }
  if (j.contains("truncate_prompt_tokens") && !j["truncate_prompt_tokens"].is_null()) {
    return Invalid("truncate_prompt_tokens: not read here; texts are cut at the model's max_tokens");
  }
  if (j.contains("messages")) return Invalid("messages: the chat form is not read here; send \"input\"");
  return absl::OkStatus();
}

}  // namespace

bool IsTeiEmptyRefusal(absl::string_view message) {
  return absl::StartsWith(message, "Input validation error: `") && absl::EndsWith(message, "` cannot be empty");
}

absl::StatusOr<TeiPredict> ParseTeiPredict(const std::string& body, int max_texts) {
  // Its cost bounded before anything is built (json_body.h): malformed JSON named by byte, invalid UTF-8, deep
  // nesting, more values than a request of max_texts texts needs.
  if (absl::Status scanned = ScanBody(body, max_texts); !scanned.ok()) return scanned;
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("the body is not a JSON object");
  if (!j.contains("inputs")) return Invalid("inputs: missing");
  TeiPredict out;
  if (absl::Status s = ReadInputs(j["inputs"], max_texts, out); !s.ok()) return s;
  bool truncate = true, raw_scores = false;
  if (absl::Status s = ReadFlag(j, "truncate", truncate); !s.ok()) return s;
  out.refuse_truncation = !truncate;
  if (absl::Status s = ReadFlag(j, "raw_scores", raw_scores); !s.ok()) return s;
  if (raw_scores) {
    return Invalid(
        "raw_scores: the models' logits are not answered here (only probabilities; the native "
        "options.raw_scores gives the uncalibrated softmax)");
  }
  if (j.contains("truncation_direction") && !j["truncation_direction"].is_null() &&
      j["truncation_direction"] != "right" && j["truncation_direction"] != "Right") {
    return Invalid("truncation_direction: only \"right\" (texts are cut at their end)");
  }
  if (j.contains("parameters") && !j["parameters"].is_null()) {
    if (absl::Status s = ReadParameters(j["parameters"], out); !s.ok()) return s;
  }
  if (absl::Status s = ReadFlag(j, "explain", out.explain); !s.ok()) return s;
  return out;
}

absl::StatusOr<TeiTokenize> ParseTeiTokenize(const std::string& body, int max_texts, int max_text_bytes) {
  if (absl::Status scanned = ScanBody(body, max_texts); !scanned.ok()) return scanned;  // json_body.h
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("the body is not a JSON object");
  if (!j.contains("inputs")) return Invalid("inputs: missing");
  TeiTokenize out;
  const json& inputs = j["inputs"];
  if (inputs.is_array()) {
    if (inputs.empty()) return Invalid(kEmpty);
    if (static_cast<int64_t>(inputs.size()) > max_texts) {
      return Invalid(absl::StrCat("batch size ", inputs.size(), " > maximum allowed batch size ", max_texts,
                                  " (--max-texts-per-request)"));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (absl::Status s = ReadText(inputs[i], absl::StrCat("inputs[", i, "]"), max_text_bytes, out.texts); !s.ok()) {
        return s;
      }
    }
  } else if (absl::Status s = ReadText(inputs, "inputs", max_text_bytes, out.texts); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadFlag(j, "add_special_tokens", out.add_special_tokens); !s.ok()) return s;
  if (j.contains("prompt_name") && !j["prompt_name"].is_null()) {
    return Invalid("prompt_name: these models have no prompts (an embedding model's, in TEI)");
  }
  return out;
}

absl::StatusOr<TeiDecode> ParseTeiDecode(const std::string& body, int max_texts) {
  if (absl::Status scanned = ScanBody(body, max_texts * kIdsPerText); !scanned.ok()) {
    if (!absl::StrContains(scanned.message(), "JSON values")) return scanned;
    return Invalid(absl::StrCat("ids: more than ", 4 * int64_t{max_texts} * kIdsPerText + 1024, " values; a request ",
                                "holds at most ", max_texts, " lists of ids (", 4 * kIdsPerText,
                                " ids a list on average)"));
  }
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("the body is not a JSON object");
  if (!j.contains("ids")) return Invalid("ids: missing");
  const json& ids = j["ids"];
  if (!ids.is_array()) return Invalid("ids: a list of token ids, or a list of such lists");
  TeiDecode out;
  out.batch = !ids.empty() && ids[0].is_array();
  if (out.batch) {
    if (static_cast<int64_t>(ids.size()) > max_texts) {
      return Invalid(absl::StrCat("batch size ", ids.size(), " > maximum allowed batch size ", max_texts,
                                  " (--max-texts-per-request)"));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string field = absl::StrCat("ids[", i, "]");
      if (!ids[i].is_array()) return Invalid(absl::StrCat(field, ": not a list of token ids"));
      absl::StatusOr<std::vector<int64_t>> list = ReadIds(ids[i], field);
      if (!list.ok()) return list.status();
      out.ids.push_back(*std::move(list));
    }
  } else {
    absl::StatusOr<std::vector<int64_t>> list = ReadIds(ids, "ids");
    if (!list.ok()) return list.status();
    out.ids.push_back(*std::move(list));
  }
  if (absl::Status s = ReadFlag(j, "skip_special_tokens", out.skip_special_tokens); !s.ok()) return s;
  return out;
}

absl::StatusOr<TokenClassification> ParseTokenClassification(const std::string& body, int max_texts) {
  if (absl::Status scanned = ScanBody(body, max_texts); !scanned.ok()) return scanned;  // json_body.h
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("the body is not a JSON object");
  if (!j.contains("inputs")) return Invalid("inputs: missing");
  TokenClassification out;
  if (absl::Status s = ReadFlag(j, "explain", out.explain); !s.ok()) return s;
  if (absl::Status s = ReadInputs(j["inputs"], max_texts, out); !s.ok()) return s;
  if (j.contains("parameters") && !j["parameters"].is_null()) {
    if (absl::Status s = ReadParameters(j["parameters"], out); !s.ok()) return s;
  }
  return out;
}

absl::StatusOr<OpenAiClassify> ParseOpenAiClassify(const std::string& body, int max_texts) {
  if (absl::Status scanned = ScanBody(body, max_texts); !scanned.ok()) return scanned;  // json_body.h
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("the body is not a JSON object");
  OpenAiClassify out;
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return Invalid("model: not a name");
    out.model = j["model"].get<std::string>();
  }
  if (absl::Status s = CheckUnanswered(j); !s.ok()) return s;
  if (absl::Status s = ReadFlag(j, "explain", out.explain); !s.ok()) return s;
  if (!j.contains("input")) return Invalid("input: missing");
  const nlohmann::json& input = j["input"];
  if (input.is_string()) {
    out.texts.push_back(input.get<std::string>());
    return out;
  }
  if (!input.is_array() || input.empty()) return Invalid("input: a text or a list of texts");
  if (static_cast<int64_t>(input.size()) > max_texts) {
    return Invalid(
        absl::StrCat("input: ", input.size(), " texts, more than ", max_texts, " (--max-texts-per-request)"));
  }
  for (size_t i = 0; i < input.size(); ++i) {
    if (input[i].is_number() || input[i].is_array()) {
      return Invalid(absl::StrCat("input[", i, "]: token ids are not read here; send texts"));
    }
    if (!input[i].is_string()) return Invalid(absl::StrCat("input[", i, "]: not a text"));
    out.texts.push_back(input[i].get<std::string>());
  }
  return out;
}

absl::StatusOr<OpenAiPooling> ParseOpenAiPooling(const std::string& body, int max_texts) {
  absl::StatusOr<OpenAiClassify> request = ParseOpenAiClassify(body, max_texts);  // scanned, model, input
  if (!request.ok()) return request.status();
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  OpenAiPooling out{*std::move(request), ""};
  if (j.contains("task") && !j["task"].is_null()) {
    const json& task = j["task"];
    if (task != "token_classify" && task != "classify") {
      return Invalid("task: \"token_classify\" or \"classify\" (these models make no embeddings)");
    }
    out.task = task.get<std::string>();
  }
  if (j.contains("encoding_format") && !j["encoding_format"].is_null() && j["encoding_format"] != "float") {
    return Invalid("encoding_format: only \"float\"");
  }
  if (j.contains("dimensions") && !j["dimensions"].is_null()) {
    return Invalid("dimensions: not read here (an embedding's; these models make none)");
  }
  if (out.request.explain && out.task == "token_classify") {
    return Invalid("explain: for classify (a tagger's entities and words come with token_classify's answer)");
  }
  return out;
}

}  // namespace qvi

#include "server/http/hf/pipeline_routes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/drop_in.h"
#include "server/http/native/json_body.h"

namespace qvi {
namespace {

using json = nlohmann::json;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// TEI's "Empty" message (tei_routes.cc tells it by its start: a 400, not a 422).
constexpr char kEmpty[] = "Input validation error: `inputs` cannot be empty";

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
    const json& a = p["aggregation_strategy"];
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

// One text's entities as the pipeline writes an aggregated entity.
nlohmann::ordered_json Entities(const TextResult& r, const std::vector<std::string>& ignore) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const SpanOutput& span : r.spans) {
    if (std::find(ignore.begin(), ignore.end(), span.label) != ignore.end()) continue;
    out.push_back(nlohmann::ordered_json{{"entity_group", span.label},
                                         {"score", ShortestDouble(span.score)},
                                         {"word", span.text},
                                         {"start", span.start},
                                         {"end", span.end}});
  }
  return out;
}

}  // namespace

absl::StatusOr<TokenClassification> ParseTokenClassification(const std::string& body, int max_texts) {
  if (absl::Status scanned = ScanBody(body, max_texts); !scanned.ok()) return scanned;  // json_body.h
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("the body is not a JSON object");
  if (!j.contains("inputs")) return Invalid("inputs: missing");
  TokenClassification out;
  if (absl::Status s = ReadInputs(j["inputs"], max_texts, out); !s.ok()) return s;
  if (j.contains("parameters") && !j["parameters"].is_null()) {
    if (absl::Status s = ReadParameters(j["parameters"], out); !s.ok()) return s;
  }
  return out;
}

void ServeTokenClassification(Core* core, std::shared_ptr<HttpCall> call, const std::string& model,
                              HttpRequest request) {
  absl::StatusOr<TokenClassification> parsed = ParseTokenClassification(request.body, core->limits().max_texts);
  if (!parsed.ok()) return call->Fail(parsed.status());
  request.body.clear();
  auto decoded = std::make_shared<InferenceRequest>();
  decoded->model = model;
  decoded->texts = std::move(parsed->texts);
  auto build = [batch = parsed->batch,
                ignore = std::move(parsed->ignore)](const InferenceResponse& answer) -> absl::StatusOr<HttpResponse> {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const TextResult& r : answer.results) out.push_back(Entities(r, ignore));
    const nlohmann::ordered_json& body = batch || out.size() != 1 ? out : out[0];
    return HttpResponse{
        200, "application/json", body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), {}};
  };
  PlanAndSubmit(core, DecodedSteps<decltype(build)>{std::move(call), core,
                                                    std::make_shared<const HttpRequest>(std::move(request)),
                                                    Method::kTag, std::move(decoded), build});
}

}  // namespace qvi

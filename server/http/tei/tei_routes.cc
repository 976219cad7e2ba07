#include "server/http/tei/tei_routes.h"

#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/drop_in.h"
#include "server/http/hf/pipeline_routes.h"
#include "server/http/http_call.h"
#include "server/http/native/json_body.h"

namespace qvi {
namespace {

using json = nlohmann::json;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// An empty text is TEI's "Empty" error (400), told apart from other refusals by its message, TEI's own:
// "Input validation error: `inputs` cannot be empty" (/decode's: `input_ids`).
constexpr char kEmpty[] = "Input validation error: `inputs` cannot be empty";
bool IsEmptyRefusal(absl::string_view message) {
  return absl::StartsWith(message, "Input validation error: `") && absl::EndsWith(message, "` cannot be empty");
}

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

// TEI's error_type of a refusal, and its HTTP status.
std::pair<int, const char*> TeiKind(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return IsEmptyRefusal(status.message()) ? std::pair{400, "Empty"} : std::pair{422, "Validation"};
    case absl::StatusCode::kResourceExhausted:
      return {429, "Overloaded"};
    case absl::StatusCode::kUnavailable:
      return {503, "Unhealthy"};
    case absl::StatusCode::kNotFound:
      return {404, "Validation"};
    default:
      return {HttpStatus(status.code()), "Backend"};
  }
}

// Every label, best first, as TEI writes a prediction (score, then label: its fields' order kept), the first
// `top_k` (0: all).
nlohmann::ordered_json Predictions(const TextResult& result, int top_k) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& [label, score] : result.labels) {
    if (top_k > 0 && static_cast<int>(out.size()) == top_k) break;
    out.push_back(nlohmann::ordered_json{{"score", ShortestDouble(score)}, {"label", label}});
  }
  return out;
}

// Whether `model`'s current version is a tagger (one not loaded yet is taken for a classifier: predict's
// answer then says what it is).
bool IsTagger(const ModelRepository& repository, const std::string& model) {
  absl::StatusOr<ServableHandle> servable = repository.Resolve(model, 0);
  return servable.ok() && (*servable)->model->manifest().task == Task::kTagging;
}

template <typename Json>
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

bool IsTeiTarget(std::string_view target) {
  const std::string_view path = target.substr(0, target.find('?'));
  return path == "/predict" || path == "/info" || path == "/tokenize" || path == "/decode" ||
         path.substr(0, 8) == "/models/";
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
  if (j.contains("truncate") && !j["truncate"].is_null()) {
    if (!j["truncate"].is_boolean()) return Invalid("truncate: not true or false");
    out.refuse_truncation = !j["truncate"].get<bool>();
  }
  if (j.contains("raw_scores") && !j["raw_scores"].is_null()) {
    if (!j["raw_scores"].is_boolean()) return Invalid("raw_scores: not true or false");
    if (j["raw_scores"].get<bool>()) {
      return Invalid(
          "raw_scores: the models' logits are not answered here (only probabilities; the native "
          "options.raw_scores gives the uncalibrated softmax)");
    }
  }
  if (j.contains("truncation_direction") && !j["truncation_direction"].is_null() &&
      j["truncation_direction"] != "right" && j["truncation_direction"] != "Right") {
    return Invalid("truncation_direction: only \"right\" (texts are cut at their end)");
  }
  if (j.contains("parameters") && !j["parameters"].is_null()) {
    if (absl::Status s = ReadParameters(j["parameters"], out); !s.ok()) return s;
  }
  return out;
}

absl::StatusOr<std::string> TeiModel(const HttpRoute& route, const std::string& default_model,
                                     const ModelRepository& repository) {
  return ChooseModel(route.model, default_model, repository, "call /models/{m}/predict");
}

HttpResponse TeiError(const absl::Status& status) {
  HttpResponse r = ErrorResponse(status);  // its headers: WWW-Authenticate, Retry-After
  const auto [code, type] = TeiKind(status);
  r.status = code;
  r.body = Dump(json{{"error", std::string(status.message())}, {"error_type", type}});
  return r;
}

void ServeTeiPredict(Core* core, Calls* calls, const ModelRepository& repository, const std::string& default_model,
                     const HttpRoute& route, HttpRequest request, HttpServer::Reply reply) {
  absl::StatusOr<std::string> model = TeiModel(route, default_model, repository);
  const bool tagger = model.ok() && route.by_model_type && IsTagger(repository, *model);
  auto call = std::make_shared<HttpCall>(calls, tagger ? "TokenClassification" : "Predict", request, std::move(reply));
  call->set_error_form(TeiError);
  if (model.ok()) call->call().model = *model;
  if (absl::Status admitted = call->call().Admission(request.Header("Authorization")); !admitted.ok()) {
    return call->Fail(admitted);
  }
  if (!model.ok()) return call->Fail(model.status());
  if (tagger) return ServeTokenClassification(core, std::move(call), *model, std::move(request));
  absl::StatusOr<TeiPredict> parsed = ParseTeiPredict(request.body, core->limits().max_texts);
  if (!parsed.ok()) return call->Fail(parsed.status());
  request.body.clear();
  auto decoded = std::make_shared<InferenceRequest>();
  decoded->model = *model;
  decoded->texts = std::move(parsed->texts);
  decoded->options.top_k = 1 << 20;  // every label: TEI answers them all, sorted
  decoded->options.error_on_truncation = parsed->refuse_truncation;
  // (A tagger is refused by the core, as Classify on it is, before its model runs.)
  auto build = [batch = parsed->batch, nested = parsed->nested,
                top_k = parsed->top_k](const InferenceResponse& answer) -> absl::StatusOr<HttpResponse> {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const TextResult& r : answer.results) out.push_back(Predictions(r, top_k));
    const bool one = !batch && !nested && out.size() == 1;
    return HttpResponse{200, "application/json", Dump(one ? out[0] : out), {}};
  };
  PlanAndSubmit(core, DecodedSteps<decltype(build)>{std::move(call), core,
                                                    std::make_shared<const HttpRequest>(std::move(request)),
                                                    Method::kClassify, std::move(decoded), build});
}

HttpResponse TeiInfoRoute(const ModelRepository& repository, const RequestLimits& limits,
                          const std::string& default_model, const HttpRoute& route) {
  absl::StatusOr<std::string> model = TeiModel(route, default_model, repository);
  if (!model.ok()) return TeiError(model.status());
  absl::StatusOr<ServableHandle> servable = repository.Resolve(*model, 0);
  if (!servable.ok()) return TeiError(servable.status());
  const Manifest& m = (*servable)->model->manifest();
  const std::vector<std::string>& labels = m.task == Task::kClassification ? m.labels : m.tags;
  nlohmann::ordered_json id2label = nlohmann::ordered_json::object(), label2id = nlohmann::ordered_json::object();
  for (size_t i = 0; i < labels.size(); ++i) {
    id2label[std::to_string(i)] = labels[i];
    label2id[labels[i]] = i;
  }
  // A tagger is no TEI model type; it says what it is under a name of its own.
  const char* type = m.task == Task::kClassification ? "classifier" : "token_classifier";
  const std::string precision = (*servable)->model->precision();
  const nlohmann::ordered_json info = {{"model_id", m.name},
                                       {"model_sha", nullptr},
                                       {"model_dtype", precision.empty() ? "float32" : precision},
                                       {"served_model_name", *model},
                                       {"model_type", {{type, {{"id2label", id2label}, {"label2id", label2id}}}}},
                                       {"max_concurrent_requests", (*servable)->serving.max_queued_texts},
                                       {"max_input_length", m.tokenizer.max_tokens},
                                       {"max_batch_tokens", (*servable)->serving.max_batch_tokens},
                                       {"max_batch_requests", (*servable)->serving.max_batch_size},
                                       {"max_client_batch_size", limits.max_texts},
                                       {"auto_truncate", true},
                                       {"tokenization_workers", nullptr},
                                       {"version", QVI_VERSION},
                                       {"sha", nullptr},
                                       {"docker_label", nullptr},
                                       {"served_model_version", (*servable)->version}};
  return HttpResponse{200, "application/json", Dump(info), {}};
}

}  // namespace qvi

#include "server/http/tei/tei_routes.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/drop_in.h"
#include "server/http/hf/pipeline_routes.h"
#include "server/http/http_call.h"

namespace qvi {
namespace {

using json = nlohmann::json;

// TEI's error_type of a refusal, and its HTTP status.
std::pair<int, const char*> TeiKind(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return IsTeiEmptyRefusal(status.message()) ? std::pair{400, "Empty"} : std::pair{422, "Validation"};
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

absl::StatusOr<std::string> TeiModel(const HttpRoute& route, const std::string& default_model,
                                     const ModelRepository& repository, const char* verb) {
  const std::string how = absl::StrCat("call /models/{m}/", verb);
  return ChooseModel(route.model, default_model, repository, how.c_str());
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
  if (tagger) return ServeTokenClassification(core, repository, std::move(call), *model, std::move(request));
  absl::StatusOr<TeiPredict> parsed = ParseTeiPredict(request.body, core->limits().max_texts);
  if (!parsed.ok()) return call->Fail(parsed.status());
  request.body.clear();
  auto decoded = std::make_shared<InferenceRequest>();
  decoded->model = *model;
  decoded->texts = std::move(parsed->texts);
  decoded->options.top_k = 1 << 20;  // every label: TEI answers them all, sorted
  decoded->options.error_on_truncation = parsed->refuse_truncation;
  if (parsed->explain) AskExplanations(repository, *model, decoded->options);
  // (A tagger is refused by the core, as Classify on it is, before its model runs.)
  auto build = [batch = parsed->batch, nested = parsed->nested, top_k = parsed->top_k,
                explain = parsed->explain](const InferenceResponse& answer) -> absl::StatusOr<HttpResponse> {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const TextResult& r : answer.results) {
      out.push_back(Predictions(r, top_k));
      if (explain && !out.back().empty()) out.back()[0]["explanation"] = Explanation(r);  // the top prediction's
    }
    const bool one = !batch && !nested && out.size() == 1;
    return HttpResponse{200, "application/json", Dump(one ? out[0] : out), {}};
  };
  PlanAndSubmit(core, DecodedSteps<decltype(build)>{std::move(call), core,
                                                    std::make_shared<const HttpRequest>(std::move(request)),
                                                    Method::kClassify, std::move(decoded), build});
}

HttpResponse TeiInfoRoute(const ModelRepository& repository, const RequestLimits& limits,
                          const std::string& default_model, int tokenization_workers, const HttpRoute& route) {
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
                                       {"tokenization_workers", tokenization_workers},
                                       {"version", QVI_VERSION},
                                       {"sha", nullptr},
                                       {"docker_label", nullptr},
                                       {"served_model_version", (*servable)->version}};
  return HttpResponse{200, "application/json", Dump(info), {}};
}

}  // namespace qvi

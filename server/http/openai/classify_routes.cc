#include "server/http/openai/classify_routes.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/drop_in.h"
#include "server/http/http_call.h"

namespace qvi {
namespace {

using json = nlohmann::ordered_json;

std::pair<int, const char*> OpenAiKind(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return {400, "BadRequestError"};
    case absl::StatusCode::kNotFound:
      return {404, "NotFoundError"};
    case absl::StatusCode::kUnauthenticated:
      return {401, "AuthenticationError"};
    case absl::StatusCode::kPermissionDenied:
      return {403, "PermissionDeniedError"};
    case absl::StatusCode::kResourceExhausted:
      return {429, "RateLimitError"};
    case absl::StatusCode::kUnavailable:
      return {503, "ServiceUnavailableError"};
    default:
      return {HttpStatus(code) >= 500 ? HttpStatus(code) : 500, "InternalServerError"};
  }
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Each text's answer as vLLM writes it: its top label, and every label's probability in the model's order.
json Data(const InferenceResponse& answer, bool explain) {
  const std::vector<std::string>& labels = answer.manifest->labels;
  json data = json::array();
  for (size_t i = 0; i < answer.results.size(); ++i) {
    const TextResult& r = answer.results[i];
    data.push_back(json{{"index", i},
                        {"label", r.labels.empty() ? json(nullptr) : json(r.labels[0].first)},
                        {"probs", ProbabilitiesInOrder(r, labels)},
                        {"num_classes", labels.size()}});
    if (explain) data.back()["explanation"] = Explanation(r);
  }
  return data;
}

}  // namespace

bool IsOpenAiTarget(std::string_view target) {
  const std::string_view path = target.substr(0, target.find('?'));
  return path == "/classify" || path == "/v1/classify" || path == "/pooling";
}

std::string OpenAiErrorBody(absl::string_view message, const char* type, int code) {
  return Dump(json{{"error", {{"message", std::string(message)}, {"type", type}, {"param", nullptr}, {"code", code}}}});
}

HttpResponse OpenAiError(const absl::Status& status) {
  HttpResponse r = ErrorResponse(status);  // its headers: WWW-Authenticate, Retry-After
  const auto [code, type] = OpenAiKind(status.code());
  r.status = code;
  r.body = OpenAiErrorBody(status.message(), type, code);
  return r;
}

void ServeOpenAiClassify(Core* core, Calls* calls, const ModelRepository& repository, const std::string& default_model,
                         HttpRequest request, HttpServer::Reply reply) {
  auto call = std::make_shared<HttpCall>(calls, "OpenAiClassify", request, std::move(reply));
  call->set_error_form(OpenAiError);
  if (absl::Status admitted = call->call().Admission(request.Header("Authorization")); !admitted.ok()) {
    return call->Fail(admitted);
  }
  absl::StatusOr<OpenAiClassify> parsed = ParseOpenAiClassify(request.body, core->limits().max_texts);
  if (!parsed.ok()) return call->Fail(parsed.status());
  absl::StatusOr<std::string> model = ChooseModel(parsed->model, default_model, repository, "name one in \"model\"");
  if (!model.ok()) return call->Fail(model.status());
  call->call().model = *model;
  request.body.clear();
  auto decoded = std::make_shared<InferenceRequest>();
  decoded->model = *model;
  decoded->texts = std::move(parsed->texts);
  decoded->options.top_k = 1 << 20;  // every label's probability
  if (parsed->explain) AskExplanations(repository, *model, decoded->options);
  auto build = [explain = parsed->explain](const InferenceResponse& answer) -> absl::StatusOr<HttpResponse> {
    if (answer.manifest == nullptr) return absl::InternalError("the answer has no manifest");
    const json out = OpenAiList("classify", answer, Data(answer, explain));
    return HttpResponse{200, "application/json", Dump(out), {}};
  };
  PlanAndSubmit(core, DecodedSteps<decltype(build)>{std::move(call), core,
                                                    std::make_shared<const HttpRequest>(std::move(request)),
                                                    Method::kClassify, std::move(decoded), build});
}

}  // namespace qvi

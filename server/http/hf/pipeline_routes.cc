#include "server/http/hf/pipeline_routes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/drop_in.h"

namespace qvi {
namespace {

using json = nlohmann::json;

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

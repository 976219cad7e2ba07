#include "server/http/hf/pipeline_routes.h"

#include <utility>

#include "nlohmann/json.hpp"
#include "server/http/drop_in.h"

namespace qvi {

void ServeTokenClassification(Core* core, const ModelRepository& repository, std::shared_ptr<HttpCall> call,
                              const std::string& model, HttpRequest request) {
  absl::StatusOr<TokenClassification> parsed = ParseTokenClassification(request.body, core->limits().max_texts);
  if (!parsed.ok()) return call->Fail(parsed.status());
  request.body.clear();
  auto decoded = std::make_shared<InferenceRequest>();
  decoded->model = model;
  decoded->texts = std::move(parsed->texts);
  if (parsed->explain) AskEntityExplanations(repository, model, decoded->options);
  auto build = [batch = parsed->batch, ignore = std::move(parsed->ignore),
                explain = parsed->explain](const InferenceResponse& answer) -> absl::StatusOr<HttpResponse> {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const TextResult& r : answer.results) out.push_back(HfEntities(r, ignore, explain));
    const nlohmann::ordered_json& body = batch || out.size() != 1 ? out : out[0];
    return HttpResponse{
        200, "application/json", body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), {}};
  };
  PlanAndSubmit(core, DecodedSteps<decltype(build)>{std::move(call), core,
                                                    std::make_shared<const HttpRequest>(std::move(request)),
                                                    Method::kTag, std::move(decoded), build});
}

}  // namespace qvi

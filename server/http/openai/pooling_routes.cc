#include "server/http/openai/pooling_routes.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/drop_in.h"
#include "server/http/drop_in_bodies.h"
#include "server/http/http_call.h"
#include "server/http/openai/classify_routes.h"

namespace qvi {
namespace {

using json = nlohmann::ordered_json;

json Numbers(const std::vector<float>& values) {
  json out = json::array();
  for (const float v : values) out.push_back(ShortestDouble(v));
  return out;
}

// A token_classify item: each word's tag probabilities, the words and the entities (with `explain`, each
// entity's explanation).
json TokenItem(const TextResult& r, size_t index, bool explain) {
  json rows = json::array(), words = json::array();
  for (const TokenOutput& t : r.tokens) {
    rows.push_back(Numbers(t.tag_probabilities));
    words.push_back(json{{"text", t.token.text}, {"start", t.token.start}, {"end", t.token.end}, {"tag", t.tag}});
  }
  return json{{"index", index},
              {"object", "pooling"},
              {"data", std::move(rows)},
              {"words", std::move(words)},
              {"entities", HfEntities(r, {}, explain)}};
}

// A classify item: every label's probability in the model's order.
json ClassifyItem(const TextResult& r, size_t index, const std::vector<std::string>& labels, bool explain) {
  json item = {{"index", index}, {"object", "pooling"}, {"data", ProbabilitiesInOrder(r, labels)}};
  if (explain) item["explanation"] = Explanation(r);
  return item;
}

// The task a body names, else the model's: a tagger's token_classify (a model not loaded yet: classify).
bool TokenTask(const OpenAiPooling& parsed, const ModelRepository& repository, const std::string& model) {
  if (!parsed.task.empty()) return parsed.task == "token_classify";
  absl::StatusOr<ServableHandle> servable = repository.Resolve(model, 0);
  return servable.ok() && (*servable)->model->manifest().task == Task::kTagging;
}

}  // namespace

void ServeOpenAiPooling(Core* core, Calls* calls, const ModelRepository& repository, const std::string& default_model,
                        HttpRequest request, HttpServer::Reply reply) {
  auto call = std::make_shared<HttpCall>(calls, "OpenAiPooling", request, std::move(reply));
  call->set_error_form(OpenAiError);
  if (absl::Status admitted = call->call().Admission(request.Header("Authorization")); !admitted.ok()) {
    return call->Fail(admitted);
  }
  absl::StatusOr<OpenAiPooling> parsed = ParseOpenAiPooling(request.body, core->limits().max_texts);
  if (!parsed.ok()) return call->Fail(parsed.status());
  absl::StatusOr<std::string> model =
      ChooseModel(parsed->request.model, default_model, repository, "name one in \"model\"");
  if (!model.ok()) return call->Fail(model.status());
  call->call().model = *model;
  request.body.clear();
  const bool tokens = TokenTask(*parsed, repository, *model);
  auto decoded = std::make_shared<InferenceRequest>();
  decoded->model = *model;
  decoded->texts = std::move(parsed->request.texts);
  decoded->options.top_k = 1 << 20;  // a classifier: every label's probability
  decoded->options.tag_probabilities = tokens;
  if (parsed->request.explain) {
    tokens ? AskEntityExplanations(repository, *model, decoded->options)
           : AskExplanations(repository, *model, decoded->options);
  }
  auto build = [tokens,
                explain = parsed->request.explain](const InferenceResponse& answer) -> absl::StatusOr<HttpResponse> {
    if (answer.manifest == nullptr) return absl::InternalError("the answer has no manifest");
    const std::vector<std::string>& labels = tokens ? answer.manifest->tags : answer.manifest->labels;
    json data = json::array();
    for (const TextResult& r : answer.results) {
      for (const TokenOutput& t : r.tokens) {
        if (tokens && t.tag_probabilities.size() != labels.size()) {
          return absl::InternalError(absl::StrCat("the model answered ", t.tag_probabilities.size(),
                                                  " tag probabilities a word; its manifest has ", labels.size(),
                                                  " tags"));
        }
      }
    }
    for (size_t i = 0; i < answer.results.size(); ++i) {
      data.push_back(tokens ? TokenItem(answer.results[i], i, explain)
                            : ClassifyItem(answer.results[i], i, labels, explain));
    }
    json out = OpenAiList("pooling", answer, std::move(data));
    out["labels"] = labels;
    return HttpResponse{200, "application/json", out.dump(-1, ' ', false, json::error_handler_t::replace), {}};
  };
  PlanAndSubmit(core, DecodedSteps<decltype(build)>{
                          std::move(call), core, std::make_shared<const HttpRequest>(std::move(request)),
                          tokens ? Method::kTag : Method::kClassify, std::move(decoded), build});
}

}  // namespace qvi

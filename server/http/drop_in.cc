#include "server/http/drop_in.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/core/outputs/outputs.h"

namespace qvi {

void AskExplanations(const ModelRepository& repository, const std::string& model, OutputOptions& options) {
  options.Ask(OutputSwitch::kTokens);
  absl::StatusOr<ServableHandle> servable = repository.Resolve(model, 0);
  for (const OutputSwitch on : {OutputSwitch::kAttention, OutputSwitch::kGates, OutputSwitch::kContributions}) {
    const bool has =
        servable.ok() ? HasAny((*servable)->model->manifest(), SwitchedBy(on)) : on != OutputSwitch::kGates;
    if (has) options.Ask(on);
  }
}

void AskEntityExplanations(const ModelRepository& repository, const std::string& model, OutputOptions& options) {
  AskExplanations(repository, model, options);
  options.Ask(OutputSwitch::kOcclusion);
}

nlohmann::ordered_json HfEntities(const TextResult& result, const std::vector<std::string>& ignore, bool explain) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  const nlohmann::ordered_json text = explain ? Explanation(result) : nlohmann::ordered_json();
  for (const SpanOutput& span : result.spans) {
    if (std::find(ignore.begin(), ignore.end(), span.label) != ignore.end()) continue;
    nlohmann::ordered_json entity = {{"entity_group", span.label},
                                     {"score", ShortestDouble(span.score)},
                                     {"word", span.text},
                                     {"start", span.start},
                                     {"end", span.end}};
    if (explain) {
      nlohmann::ordered_json why = text;
      why["occlusion"] = nlohmann::ordered_json::array();
      for (const float drop : span.occlusion) why["occlusion"].push_back(ShortestDouble(drop));
      entity["explanation"] = std::move(why);
    }
    out.push_back(std::move(entity));
  }
  return out;
}

nlohmann::ordered_json Explanation(const TextResult& result) {
  using json = nlohmann::ordered_json;
  json words = json::array(), alpha = json::array(), beta = json::array();
  json contributions = json::object();
  for (const auto& [label, _] : result.labels) contributions[label] = json::array();
  for (const TokenOutput& t : result.tokens) {
    words.push_back(json{{"text", t.token.text}, {"start", t.token.start}, {"end", t.token.end}});
    if (t.attention) alpha.push_back(ShortestDouble(*t.attention));
    if (t.gate) beta.push_back(ShortestDouble(*t.gate));
    for (size_t k = 0; k < t.contribution.size() && k < result.labels.size(); ++k) {
      contributions[result.labels[k].first].push_back(ShortestDouble(t.contribution[k]));
    }
  }
  json out = {{"words", std::move(words)}};
  if (!alpha.empty()) out["alpha"] = std::move(alpha);
  if (!beta.empty()) out["beta"] = std::move(beta);
  if (!result.tokens.empty() && !result.tokens[0].contribution.empty()) out["contributions"] = std::move(contributions);
  return out;
}

nlohmann::ordered_json ProbabilitiesInOrder(const TextResult& result, const std::vector<std::string>& labels) {
  const absl::flat_hash_map<std::string, float> score_of(result.labels.begin(), result.labels.end());
  nlohmann::ordered_json probs = nlohmann::ordered_json::array();
  for (const std::string& label : labels) {
    const auto it = score_of.find(label);
    probs.push_back(it == score_of.end() ? 0.0 : ShortestDouble(it->second));
  }
  return probs;
}

nlohmann::ordered_json OpenAiList(const char* prefix, const InferenceResponse& answer, nlohmann::ordered_json data) {
  return {{"id", absl::StrCat(prefix, "-", answer.request_id)},
          {"object", "list"},
          {"created", absl::ToUnixSeconds(absl::Now())},
          {"model", answer.model},
          {"data", std::move(data)},
          {"usage",
           {{"prompt_tokens", answer.tokens},
            {"total_tokens", answer.tokens},
            {"completion_tokens", 0},
            {"completion_tokens_details", nullptr}}}};
}

double ShortestDouble(float v) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof(text), v);
  return ec == std::errc() ? std::strtod(std::string(text, end).c_str(), nullptr) : v;
}

}  // namespace qvi

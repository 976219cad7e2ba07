#include "server/http/drop_in.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/outputs/outputs.h"

namespace qvi {

absl::StatusOr<std::string> ChooseModel(const std::string& named, const std::string& default_model,
                                        const ModelRepository& repository, const char* how_to_name) {
  if (!named.empty()) return named;
  if (!default_model.empty()) return default_model;
  std::vector<std::string> names;
  for (const ModelStatus& m : repository.List()) names.push_back(m.name);
  if (names.size() == 1) return names[0];
  if (names.empty()) return absl::UnavailableError("no model named, and the store holds none (yet)");
  return absl::InvalidArgumentError(
      absl::StrCat("no model named: this server holds ", names.size(), " models (",
                   absl::StrJoin(names.begin(), names.begin() + std::min<size_t>(names.size(), 8), ", "),
                   names.size() > 8 ? ", ..." : "", "); ", how_to_name, ", or start it with --default-model"));
}

void AskExplanations(const ModelRepository& repository, const std::string& model, OutputOptions& options) {
  options.Ask(OutputSwitch::kTokens);
  absl::StatusOr<ServableHandle> servable = repository.Resolve(model, 0);
  for (const OutputSwitch on : {OutputSwitch::kAttention, OutputSwitch::kGates, OutputSwitch::kContributions}) {
    const bool has =
        servable.ok() ? HasAny((*servable)->model->manifest(), SwitchedBy(on)) : on != OutputSwitch::kGates;
    if (has) options.Ask(on);
  }
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

double ShortestDouble(float v) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof(text), v);
  return ec == std::errc() ? std::strtod(std::string(text, end).c_str(), nullptr) : v;
}

}  // namespace qvi

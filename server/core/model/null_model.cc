#include "server/core/model/null_model.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace qvi {
namespace {

class NullModel final : public Model {
 public:
  NullModel(Manifest manifest, Vocabulary vocabulary, torch::Device device, std::string file)
      : Model(std::move(manifest), std::move(vocabulary), device, std::move(file)) {}

  std::string format() const override { return "null"; }
  bool has_forward_without_maps() const override { return true; }
  using Model::WarmUp;

 protected:
  ModelOutputs Run(const torch::Tensor& ids, const torch::Tensor& mask, bool maps) const override {
    const Manifest& m = manifest();
    const int64_t b = ids.size(0), t = ids.size(1);
    const auto on = ids.options().dtype(torch::kFloat);
    const torch::Tensor real = mask.to(torch::kFloat);
    const torch::Tensor uniform = real / real.sum(1, /*keepdim=*/true).clamp_min(1.0);  // α: 1/n per token
    const torch::Tensor half = real * 0.5;
    ModelOutputs out;
    for (const auto& [name, shape] : m.outputs) {
      const std::optional<Output> o = OutputNamed(name);
      if (!o || Row(*o).model_shape == nullptr) continue;
      switch (*o) {
        case Output::kLogits:
          out[*o] = torch::zeros({b, static_cast<int64_t>(m.labels.size())}, on);
          break;
        case Output::kEmissions:
          out[*o] = torch::zeros({b, t, static_cast<int64_t>(m.tags.size())}, on);
          break;
        case Output::kTags:
          out[*o] = torch::zeros({b, t}, ids.options().dtype(torch::kLong));
          break;
        case Output::kAttention:
        case Output::kSentenceAttention:
          out[*o] = uniform;
          break;
        case Output::kLayerAttention:
          if (maps) out[*o] = uniform.view({b, 1, 1, 1, t}).expand({b, m.layers, m.heads, t, t});
          break;
        case Output::kLayerGates:
        case Output::kLayerLambdaQ:
        case Output::kLayerLambdaK:
          out[*o] = half.view({b, 1, 1, t}).expand({b, m.layers, m.heads, t});
          break;
        default:  // the per-token gates: β, the sentence's β, λ_Q, λ_K
          out[*o] = half;
      }
    }
    return out;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadNullModel(const std::string& path, const torch::Device& device) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  const nlohmann::json file = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!file.is_object() || !file.contains("manifest") || !file["manifest"].is_object() || !file.contains("vocab") ||
      !file["vocab"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a null model is a JSON object {\"manifest\": {...}, \"vocab\": [tokens]}"));
  }
  std::vector<std::string> tokens;
  for (const nlohmann::json& token : file["vocab"]) {
    if (!token.is_string()) return absl::InvalidArgumentError(absl::StrCat(path, ": vocab holds a non-string"));
    tokens.push_back(token.get<std::string>());
  }
  absl::StatusOr<std::pair<Manifest, Vocabulary>> files =
      ParseArtifactFiles(file["manifest"].dump(), absl::StrJoin(tokens, "\n") + "\n", path);
  if (!files.ok()) return files.status();
  auto model = std::make_unique<NullModel>(std::move(files->first), std::move(files->second), device, path);
  if (absl::Status s = model->WarmUp(); !s.ok()) return s;
  return model;
}

}  // namespace qvi

#include "server/core/model/torchscript_model.h"

#include <torch/script.h>

#include <exception>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qvi {
namespace {

class TorchScriptModel final : public Model {
 public:
  TorchScriptModel(torch::jit::Module module, Manifest manifest, Vocabulary vocabulary, torch::Device device,
                   std::string file)
      : Model(std::move(manifest), std::move(vocabulary), device, std::move(file)),
        module_(std::move(module)),
        without_maps_(module_.find_method("forward_without_maps")) {}

  std::string format() const override { return "torchscript"; }
  bool has_forward_without_maps() const override { return without_maps_.has_value(); }
  using Model::WarmUp;

 protected:
  ModelOutputs Run(const torch::Tensor& ids, const torch::Tensor& mask, bool maps) const override {
    std::vector<torch::jit::IValue> inputs{ids, mask};
    c10::Dict<c10::IValue, c10::IValue> result =
        (maps || !without_maps_ ? module_.forward(inputs) : (*without_maps_)(inputs)).toGenericDict();
    ModelOutputs out;
    for (const auto& kv : result) {
      // Names the catalogue has no model tensor for cannot be asked for: left out.
      const std::optional<Output> output = OutputNamed(kv.key().toStringRef());
      if (output && Row(*output).model_shape != nullptr) out[*output] = kv.value().toTensor();
    }
    return out;
  }

 private:
  mutable torch::jit::Module module_;               // forward() is not const in the API, but does not mutate
  std::optional<torch::jit::Method> without_maps_;  // declared after module_, which it refers to
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadTorchScript(const std::string& path, const torch::Device& device) {
  torch::jit::ExtraFilesMap extra{{"manifest.json", ""}, {"vocab.txt", ""}};
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, device, extra);
    module.eval();
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", path, " as TorchScript: ", what.substr(0, what.find('\n'))));
  }
  absl::StatusOr<std::pair<Manifest, Vocabulary>> files =
      ParseArtifactFiles(extra["manifest.json"], extra["vocab.txt"], path);
  if (!files.ok()) return files.status();
  auto model = std::make_unique<TorchScriptModel>(std::move(module), std::move(files->first), std::move(files->second),
                                                  device, path);
  if (absl::Status s = model->WarmUp(); !s.ok()) return s;
  return model;
}

}  // namespace qvi

#include "server/core/model/torchscript_model.h"

#include <torch/script.h>

#include <exception>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qvi {
namespace {

std::vector<float> FloatsOf(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// The zoo's CRF (qvi.nn.CRF, a submodule `crf`): its parameters start [K], end [K] and trans [K,K]
// (row = previous tag). nullopt when the module has none of that shape.
std::optional<CrfScores> ReadCrf(const torch::jit::Module& module) {
  std::map<std::string, at::Tensor> p;
  for (const auto& named : module.named_parameters(/*recurse=*/true)) p[named.name] = named.value;
  const auto start = p.find("crf.start"), end = p.find("crf.end"), trans = p.find("crf.trans");
  if (start == p.end() || end == p.end() || trans == p.end()) return std::nullopt;
  const int64_t k = start->second.numel();
  if (end->second.numel() != k || trans->second.dim() != 2 || trans->second.size(0) != k ||
      trans->second.size(1) != k) {
    return std::nullopt;
  }
  return CrfScores{FloatsOf(start->second), FloatsOf(end->second), FloatsOf(trans->second)};
}

class TorchScriptModel final : public Model {
 public:
  TorchScriptModel(torch::jit::Module module, Manifest manifest, Vocabulary vocabulary, c10::Device device,
                   std::string file)
      : Model(std::move(manifest), std::move(vocabulary), device, std::move(file)),
        module_(std::move(module)),
        without_maps_(module_.find_method("forward_without_maps")),
        crf_(ReadCrf(module_)) {}

  std::string format() const override { return "torchscript"; }
  bool has_forward_without_maps() const override { return without_maps_.has_value(); }
  const CrfScores* crf() const override { return crf_ ? &*crf_ : nullptr; }
  using Model::ReadSubwordTokenizer;
  using Model::WarmUp;

 protected:
  ModelOutputs Run(const at::Tensor& ids, const at::Tensor& mask, bool maps) const override {
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
  std::optional<CrfScores> crf_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadTorchScript(const std::string& path, const c10::Device& device) {
  // tokenizer.json: a sub-word model's (manifest format 2; the name its tokenizer.file gives).
  torch::jit::ExtraFilesMap extra{{"manifest.json", ""}, {"vocab.txt", ""}, {"tokenizer.json", ""}};
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
  if (absl::Status s = model->ReadSubwordTokenizer(extra["tokenizer.json"]); !s.ok()) return s;
  if (absl::Status s = model->WarmUp(); !s.ok()) return s;
  return model;
}

}  // namespace qvi

// Model::Load: the format factory, above both backends (the one file that knows them all), and the
// files every artifact carries.
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/model/aoti_model.h"
#include "server/core/model/model.h"
#include "server/core/model/null_model.h"
#include "server/core/model/torchscript_model.h"

namespace qvi {

std::string Pt2FileName(const torch::Device& device) { return device.is_cuda() ? "model.cuda.pt2" : "model.cpu.pt2"; }

std::vector<std::string> ModelFileNames() {
  return {kTorchScriptFile, "model.cpu.pt2", "model.cuda.pt2", kNullModelFile};
}

absl::StatusOr<std::pair<Manifest, Vocabulary>> ParseArtifactFiles(const std::string& manifest_json,
                                                                   const std::string& vocab_txt,
                                                                   const std::string& where) {
  if (manifest_json.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " has no manifest.json"));
  absl::StatusOr<Manifest> manifest = Manifest::Parse(manifest_json);
  if (!manifest.ok()) return manifest.status();
  absl::StatusOr<Vocabulary> vocab = Vocabulary::Parse(vocab_txt);
  if (!vocab.ok()) return vocab.status();
  if (static_cast<int>(vocab->size()) != manifest->vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab.txt has ", vocab->size(), " tokens but manifest.json says ", manifest->vocab_size));
  }
  return std::make_pair(*std::move(manifest), *std::move(vocab));
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, const LoadOptions& options) {
  absl::StatusOr<torch::Device> device = ResolveDevice(options.device);
  if (!device.ok()) return device.status();
  const std::filesystem::path folder(dir);
  const std::string script = (folder / kTorchScriptFile).string();
  const std::string package = (folder / Pt2FileName(*device)).string();
  std::error_code ec;
  // A null model (the serving path's benchmark) is served as such whatever the format says.
  if (const std::string null = (folder / kNullModelFile).string(); std::filesystem::exists(null, ec)) {
    return LoadNullModel(null, *device);
  }
  const bool have_script = std::filesystem::exists(script, ec);
  const bool have_package = std::filesystem::exists(package, ec);
  const ModelFormat format = options.format;
  if (format == ModelFormat::kTorchScript || (format == ModelFormat::kAuto && !have_package)) {
    if (!have_script) {
      return absl::NotFoundError(
          format == ModelFormat::kAuto
              ? absl::StrCat(dir, " has neither ", kTorchScriptFile, " nor ", Pt2FileName(*device))
              : absl::StrCat(script, " does not exist (format torchscript)"));
    }
    return LoadTorchScript(script, *device);
  }
  if (!have_package) return absl::NotFoundError(absl::StrCat(package, " does not exist (format pt2)"));
  absl::StatusOr<std::unique_ptr<Model>> compiled = LoadAotInductor(package, *device, options.instances);
  if (compiled.ok() || format == ModelFormat::kPt2 || !have_script) return compiled;
  // "auto": a package that cannot run here (another device, CPU or torch) leaves the TorchScript
  // file to serve; the reason stays visible in the log and in GetModel.
  absl::StatusOr<std::unique_ptr<Model>> script_model = LoadTorchScript(script, *device);
  if (!script_model.ok()) {
    return absl::Status(script_model.status().code(),
                        absl::StrCat(script_model.status().message(), "; and ", Pt2FileName(*device),
                                     " did not load either: ", compiled.status().message()));
  }
  (*script_model)->fallback_reason_ = absl::StrCat(Pt2FileName(*device), " not used: ", compiled.status().message());
  return script_model;
}

}  // namespace qvi

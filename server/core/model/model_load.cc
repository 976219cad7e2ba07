// Model::Load: the format factory, above both backends (the one file that knows them all), and the
// files every artifact carries.
#include <algorithm>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/model/aoti_model.h"
#include "server/core/model/model.h"
#include "server/core/model/null_model.h"
#include "server/core/model/torchscript_model.h"

namespace qvi {

std::string Pt2FileName(const c10::Device& device) { return device.is_cuda() ? "model.cuda.pt2" : "model.cpu.pt2"; }

std::vector<std::string> ModelFileNames() {
  std::vector<std::string> names = {kTorchScriptFile, "model.cuda.pt2", kNullModelFile};
  for (const char* package : kCpuPackages) names.push_back(CpuPackageFile(package));
  return names;
}

namespace {

// The packages Load tries for `device`, in order, of those the folder holds: on a GPU
// model.cuda.pt2; on the CPU the one `cpu_package` pins, or each of kCpuPackages. `pinned_missing`
// names a pinned file the folder lacks.
std::vector<std::string> PackageCandidates(const std::filesystem::path& folder, const c10::Device& device,
                                           const std::string& cpu_package, std::string& pinned_missing) {
  std::vector<std::string> names;
  if (device.is_cuda()) {
    names.push_back(Pt2FileName(device));
  } else if (cpu_package != "auto") {
    names.push_back(CpuPackageFile(cpu_package));
  } else {
    for (const char* package : kCpuPackages) names.push_back(CpuPackageFile(package));
  }
  std::vector<std::string> out;
  std::error_code ec;
  for (const std::string& name : names) {
    if (std::filesystem::exists(folder / name, ec)) out.push_back((folder / name).string());
  }
  if (out.empty() && !device.is_cuda() && cpu_package != "auto") {
    pinned_missing = absl::StrCat("cpu_package pins ", names[0], ", which ", folder.string(), " does not hold");
  }
  return out;
}

}  // namespace

absl::StatusOr<std::pair<Manifest, Vocabulary>> ParseArtifactFiles(const std::string& manifest_json,
                                                                   const std::string& vocab_txt,
                                                                   const std::string& where) {
  if (manifest_json.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " has no manifest.json"));
  absl::StatusOr<Manifest> manifest = Manifest::Parse(manifest_json);
  if (!manifest.ok()) return manifest.status();
  if (manifest->subwords()) return std::make_pair(*std::move(manifest), Vocabulary());
  absl::StatusOr<Vocabulary> vocab = Vocabulary::Parse(vocab_txt);
  if (!vocab.ok()) return vocab.status();
  if (static_cast<int>(vocab->size()) != manifest->vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab.txt has ", vocab->size(), " tokens but manifest.json says ", manifest->vocab_size));
  }
  return std::make_pair(*std::move(manifest), *std::move(vocab));
}

absl::Status Model::ReadSubwordTokenizer(const std::string& tokenizer_json) {
  const Manifest& m = *manifest_;
  if (!m.subwords()) return absl::OkStatus();
  if (tokenizer_json.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, " has no ", m.tokenizer_file, ", which its manifest's tokenizer.file names"));
  }
  absl::StatusOr<std::unique_ptr<hf::HfTokenizer>> read = hf::HfTokenizer::FromJson(tokenizer_json);
  if (!read.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", m.tokenizer_file, ": ", read.status().message()));
  }
  // The vocabulary's ids, and the post-processor's (its [CLS] may name any id), must fit the embedding.
  int64_t largest = (*read)->VocabularySize() - 1;
  for (const hf::SubwordToken& t : (*read)->AddSpecialTokens({})) largest = std::max(largest, t.id);
  if (largest >= m.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", m.tokenizer_file, " has ids up to ", largest,
                                                   " but the model's vocab_size is ", m.vocab_size,
                                                   " (manifest tokenizer.vocab_size)"));
  }
  if (m.tokenizer.max_tokens <= (*read)->SpecialTokensAdded()) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.json: field 'tokenizer.max_tokens' is ",
                                                   m.tokenizer.max_tokens, ", no more than the ",
                                                   (*read)->SpecialTokensAdded(), " special tokens a text gets"));
  }
  subwords_ = std::move(*read);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, const LoadOptions& options) {
  absl::StatusOr<c10::Device> device = ResolveDevice(options.device);
  if (!device.ok()) return device.status();
  if (absl::Status s = CheckCpuPackage(options.cpu_package); !s.ok()) return s;
  const std::filesystem::path folder(dir);
  const std::string script = (folder / kTorchScriptFile).string();
  std::error_code ec;
  // A null model (the serving path's benchmark) is served as such whatever the format says.
  if (const std::string null = (folder / kNullModelFile).string(); std::filesystem::exists(null, ec)) {
    return LoadNullModel(null, *device);
  }
  std::string pinned_missing;
  const std::vector<std::string> packages = PackageCandidates(folder, *device, options.cpu_package, pinned_missing);
  const bool have_script = std::filesystem::exists(script, ec);
  const ModelFormat format = options.format;
  if (format == ModelFormat::kTorchScript || (format == ModelFormat::kAuto && packages.empty())) {
    if (!have_script) {
      return absl::NotFoundError(
          format == ModelFormat::kAuto
              ? absl::StrCat(dir, " has neither ", kTorchScriptFile, " nor ", Pt2FileName(*device),
                             pinned_missing.empty() ? "" : absl::StrCat(" (", pinned_missing, ")"))
              : absl::StrCat(script, " does not exist (format torchscript)"));
    }
    absl::StatusOr<std::unique_ptr<Model>> script_model = LoadTorchScript(script, *device);
    if (script_model.ok() && format == ModelFormat::kAuto) (*script_model)->fallback_reason_ = pinned_missing;
    return script_model;
  }
  if (packages.empty()) {
    return absl::NotFoundError(
        pinned_missing.empty() ? absl::StrCat((folder / Pt2FileName(*device)).string(), " does not exist (format pt2)")
                               : absl::StrCat(pinned_missing, " (format pt2)"));
  }
  // The packages in order of preference: the first that runs here serves; why each one before it
  // did not (another CPU, device or torch) stays visible in the log and in GetModel.
  std::vector<std::string> passed_over;
  absl::Status last;
  for (const std::string& package : packages) {
    absl::StatusOr<std::unique_ptr<Model>> compiled = LoadAotInductor(package, *device, options.instances);
    if (compiled.ok()) {
      (*compiled)->fallback_reason_ = absl::StrJoin(passed_over, "; ");
      return compiled;
    }
    last = compiled.status();
    passed_over.push_back(
        absl::StrCat(std::filesystem::path(package).filename().string(), " not used: ", compiled.status().message()));
  }
  if (format == ModelFormat::kPt2 || !have_script) {
    return absl::Status(last.code(), absl::StrJoin(passed_over, "; "));
  }
  // "auto": no package can run here, so the TorchScript file serves.
  absl::StatusOr<std::unique_ptr<Model>> script_model = LoadTorchScript(script, *device);
  if (!script_model.ok()) {
    return absl::Status(script_model.status().code(),
                        absl::StrCat(script_model.status().message(),
                                     "; and no package loaded either: ", absl::StrJoin(passed_over, "; ")));
  }
  (*script_model)->fallback_reason_ = absl::StrJoin(passed_over, "; ");
  return script_model;
}

}  // namespace qvi

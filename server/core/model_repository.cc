#include "server/core/model_repository.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qvi {

namespace fs = std::filesystem;

namespace {

absl::Status UnknownModel(const std::string& name, const std::vector<std::string>& names) {
  return absl::NotFoundError(absl::StrCat("model '", name, "' not found; models: ",
                                          names.empty() ? "(none)" : absl::StrJoin(names, ", ")));
}

}  // namespace

const char* ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading: return "LOADING";
    case ModelState::kReady: return "READY";
    case ModelState::kFailed: return "FAILED";
    case ModelState::kUnloading: return "UNLOADING";
  }
  return "UNKNOWN";
}

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Create(const Options& options) {
  std::error_code ec;
  if (!fs::is_directory(options.root, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--model-store '", options.root, "' is not a directory"));
  }
  absl::StatusOr<torch::Device> device = ResolveDevice(options.defaults.device);
  if (!device.ok()) return device.status();
  return std::unique_ptr<ModelRepository>(new ModelRepository(options));
}

std::map<std::string, std::vector<int64_t>> ModelRepository::Scan() const {
  std::map<std::string, std::vector<int64_t>> found;
  std::error_code ec;
  for (const fs::directory_entry& model : fs::directory_iterator(options_.root, ec)) {
    if (!model.is_directory(ec) || model.path().filename().string().rfind('.', 0) == 0) continue;
    std::vector<int64_t>& versions = found[model.path().filename().string()];
    for (const fs::directory_entry& v : fs::directory_iterator(model.path(), ec)) {
      int64_t number = 0;
      if (v.is_directory(ec) && absl::SimpleAtoi(v.path().filename().string(), &number) && number > 0 &&
          v.path().filename().string() == absl::StrCat(number)) {
        versions.push_back(number);
      }
    }
    std::sort(versions.begin(), versions.end());
    if (versions.empty()) found.erase(model.path().filename().string());
  }
  return found;
}

void ModelRepository::LoadAll(const LoadListener& listener) {
  for (const auto& [name, versions] : Scan()) {
    for (int64_t version : versions) {
      {
        absl::MutexLock lock(&mu_);
        if (models_[name].count(version)) continue;
        models_[name][version] = VersionStatus{version, ModelState::kLoading, "loading", nullptr};
      }
      const std::string path = (fs::path(options_.root) / name / std::to_string(version) / "model.pt").string();
      VersionStatus status{version, ModelState::kLoading, "", nullptr};
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        status.state = ModelState::kFailed;
        status.reason = absl::StrCat(path, " does not exist");
      } else {
        absl::StatusOr<ServingOverrides> overrides = ServingOverrides::Read((fs::path(options_.root) / name).string());
        absl::StatusOr<std::unique_ptr<Model>> model =
            overrides.ok() ? Model::Load(path, overrides->device.value_or(options_.defaults.device))
                           : absl::StatusOr<std::unique_ptr<Model>>(overrides.status());
        if (model.ok() && (*model)->manifest().name != name) {
          model = absl::InvalidArgumentError(absl::StrCat("manifest.json names the model '", (*model)->manifest().name,
                                                          "' but it sits in the folder '", name, "'"));
        }
        if (model.ok()) {
          status.serving = ResolveServingConfig(options_.defaults, (*model)->manifest(), *overrides);
          status.serving.device = (*model)->device();
          status.state = ModelState::kReady;
          status.model = std::shared_ptr<const Model>(std::move(*model));
        } else {
          status.state = ModelState::kFailed;
          status.reason = std::string(model.status().message());
        }
      }
      {
        absl::MutexLock lock(&mu_);
        models_[name][version] = status;
      }
      if (listener) listener(name, status);
    }
  }
}

absl::StatusOr<ServableHandle> ModelRepository::Resolve(const std::string& name, int64_t version) const {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) {
    std::vector<std::string> names;
    for (const auto& [n, _] : models_) names.push_back(n);
    return UnknownModel(name, names);
  }
  const std::map<int64_t, VersionStatus>& versions = it->second;
  if (version == 0) {
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
      if (v->second.state == ModelState::kReady) return ServableHandle{v->second.model, v->first, v->second.serving};
    }
    std::vector<std::string> why;
    for (const auto& [n, s] : versions) why.push_back(absl::StrCat(n, " ", ModelStateName(s.state), ": ", s.reason));
    return absl::UnavailableError(absl::StrCat("model '", name, "' has no ready version (", absl::StrJoin(why, "; "), ")"));
  }
  auto v = versions.find(version);
  if (v == versions.end()) {
    std::vector<int64_t> numbers;
    for (const auto& [n, _] : versions) numbers.push_back(n);
    return absl::NotFoundError(absl::StrCat("model '", name, "' has no version ", version, "; versions: ",
                                            absl::StrJoin(numbers, ", ")));
  }
  if (v->second.state != ModelState::kReady) {
    return absl::UnavailableError(absl::StrCat("model '", name, "' version ", version, " is ",
                                               ModelStateName(v->second.state), ": ", v->second.reason));
  }
  return ServableHandle{v->second.model, version, v->second.serving};
}

std::vector<ModelStatus> ModelRepository::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<ModelStatus> out;
  for (const auto& [name, versions] : models_) {
    ModelStatus m{name, {}};
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) m.versions.push_back(v->second);
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<ModelStatus> ModelRepository::Get(const std::string& name) const {
  std::vector<std::string> names;
  for (ModelStatus& m : List()) {
    if (m.name == name) return std::move(m);
    names.push_back(m.name);
  }
  return UnknownModel(name, names);
}

}  // namespace qvi

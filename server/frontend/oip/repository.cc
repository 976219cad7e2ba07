#include "server/frontend/oip/repository.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/request/request_checks.h"

namespace qvi {
namespace {

// The index's state of a version: OIP's words (Triton's), with FAILED as UNAVAILABLE.
const char* IndexState(ModelState state) {
  switch (state) {
    case ModelState::kReady:
      return "READY";
    case ModelState::kLoading:
      return "LOADING";
    case ModelState::kUnloading:
      return "UNLOADING";
    case ModelState::kFailed:
    case ModelState::kUnloaded:
      return "UNAVAILABLE";
  }
  return "UNAVAILABLE";
}

using Parameters = google::protobuf::Map<std::string, inference::ModelRepositoryParameter>;

absl::Status CheckParameters(const Parameters& parameters, bool unload) {
  for (const auto& [name, value] : parameters) {
    if (unload && name == "unload_dependents") {
      if (value.parameter_choice_case() != inference::ModelRepositoryParameter::kBoolParam) {
        return absl::InvalidArgumentError("parameters.unload_dependents: must be a bool");
      }
      continue;  // no model here depends on another: nothing more to unload
    }
    if (!unload && (name == "config" || name.rfind("file:", 0) == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameters.", Capped(name, 64),
          ": a load takes the model from its folder in the store, with its serving.json; it cannot be given "
          "a configuration or files"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("parameters.", Capped(name, 64), ": not a parameter of ",
                     unload ? "RepositoryModelUnload (unload_dependents)" : "RepositoryModelLoad (it takes none)"));
  }
  return absl::OkStatus();
}

absl::Status CheckModelName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("model_name: empty; name a model of the store");
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRepositoryName(const std::string& name) {
  if (name.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("repository_name: '", Capped(name, 64), "'; the server has one model store: leave it empty"));
}

absl::Status OipRepository::Index(const inference::RepositoryIndexRequest& request,
                                  inference::RepositoryIndexResponse* response) const {
  if (absl::Status s = CheckRepositoryName(request.repository_name()); !s.ok()) return s;
  for (const ModelStatus& model : repository_->Index()) {
    if (model.versions.empty() && !request.ready()) {
      auto* m = response->add_models();
      m->set_name(model.name);
      m->set_state("UNAVAILABLE");
      m->set_reason(model.not_loaded.empty() ? "not loaded" : model.not_loaded);
    }
    for (auto v = model.versions.rbegin(); v != model.versions.rend(); ++v) {  // oldest first
      if (request.ready() && v->state != ModelState::kReady) continue;
      auto* m = response->add_models();
      m->set_name(model.name);
      m->set_version(absl::StrCat(v->version));
      m->set_state(IndexState(v->state));
      m->set_reason(v->state == ModelState::kReady ? "" : v->reason);
    }
  }
  return absl::OkStatus();
}

std::string ControlledModel(const std::string& repository_name, const std::string& model_name) {
  return model_name.empty() ? repository_name : model_name;  // KServe's layout: the model in field 1
}

void OipRepository::Load(const inference::RepositoryModelLoadRequest& request, Done done) const {
  const std::string model = ControlledModel(request.repository_name(), request.model_name());
  absl::Status s = CheckRepositoryName(request.model_name().empty() ? "" : request.repository_name());
  if (s.ok()) s = CheckModelName(model);
  if (s.ok()) s = CheckParameters(request.parameters(), /*unload=*/false);
  if (!s.ok()) return done(s);
  repository_->RequestLoad(model, std::move(done));
}

void OipRepository::Unload(const inference::RepositoryModelUnloadRequest& request, Done done) const {
  const std::string model = ControlledModel(request.repository_name(), request.model_name());
  absl::Status s = CheckRepositoryName(request.model_name().empty() ? "" : request.repository_name());
  if (s.ok()) s = CheckModelName(model);
  if (s.ok()) s = CheckParameters(request.parameters(), /*unload=*/true);
  if (!s.ok()) return done(s);
  repository_->RequestUnload(model, std::move(done));
}

}  // namespace qvi

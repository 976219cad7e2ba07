#include "server/frontend/oip/api.h"

#include <nlohmann/json.hpp>

#include <utility>

#include "absl/strings/str_cat.h"

#ifndef QVI_VERSION
#define QVI_VERSION "0.0.0"
#endif

namespace qvi {
namespace {

void AddTensor(const TensorSpec& spec, inference::ModelMetadataResponse::TensorMetadata* out) {
  out->set_name(spec.name);
  out->set_datatype(spec.datatype);
  for (int64_t d : spec.shape) out->add_shape(d);
}

}  // namespace

void OipApi::ServerMetadata(inference::ServerMetadataResponse* response) {
  response->set_name("qvi-serve");
  response->set_version(QVI_VERSION);
  response->add_extensions("classification");
}

absl::StatusOr<OipApi::Planned> OipApi::Plan(const inference::ModelInferRequest& request,
                                             const ServableHandle& loaded) const {
  // The model's task decides Classify or Tag, and its manifest which outputs exist: the plan is
  // checked against one version, and the core answers from that same version.
  if (absl::Status s = CheckModelNameBytes("model_name", request.model_name(), limits_); !s.ok()) return s;
  absl::StatusOr<int64_t> version = oip::ParseVersion("model_version", request.model_version());
  if (!version.ok()) return version.status();
  absl::StatusOr<ServableHandle> servable = Serving(loaded, request.model_name(), *version);
  if (*servable == nullptr) servable = repository_->Resolve(request.model_name(), *version);
  if (!servable.ok()) return servable.status();
  absl::StatusOr<oip::InferPlan> plan =
      oip::FromModelInfer(request, (*servable)->model->manifest(), (*servable)->serving);
  if (!plan.ok()) return plan.status();
  Planned planned{std::move(*servable), std::make_shared<oip::InferPlan>(std::move(*plan))};
  // Padded tensors can be far larger than the texts: the core sizes the answer before the model
  // runs (INVALID_ARGUMENT, as for the native API) from this bound.
  planned.plan->request.estimate_response_bytes = [plan = planned.plan.get()](const InferenceRequest& r,
                                                                              const InferenceResponse& tokenised) {
    return oip::AnswerBytesBefore(r, tokenised, *plan);
  };
  return planned;
}

absl::Status OipApi::BuildAnswer(const InferenceResponse& answer, const oip::InferPlan& plan, const std::string& id,
                                 inference::ModelInferResponse* response) const {
  // The bound was checked before the model ran; this is the exact size, kept as a guard.
  if (absl::Status s = calls_->CheckAnswerSize(oip::AnswerBytes(answer, plan)); !s.ok()) return s;
  oip::ToModelInfer(answer, plan, id, response);
  return absl::OkStatus();
}

absl::Status OipApi::ModelReady(const inference::ModelReadyRequest& request,
                                inference::ModelReadyResponse* response) const {
  if (absl::Status s = CheckModelNameBytes("name", request.name(), limits_); !s.ok()) return s;
  absl::StatusOr<int64_t> version = oip::ParseVersion("version", request.version());
  if (!version.ok()) return version.status();
  absl::StatusOr<ModelStatus> model = repository_->Get(request.name());
  if (!model.ok()) return model.status();
  bool ready = false;
  bool known = *version == 0;
  for (const VersionStatus& v : model->versions) {
    if (*version != 0 && v.version != *version) continue;
    known = true;
    ready = ready || v.state == ModelState::kReady;
  }
  if (!known) {
    return absl::NotFoundError(absl::StrCat("model '", model->name, "' has no version ", *version));
  }
  response->set_ready(ready && ServerReady());
  return absl::OkStatus();
}

absl::Status OipApi::ModelMetadata(const inference::ModelMetadataRequest& request,
                                   inference::ModelMetadataResponse* response) const {
  if (absl::Status s = CheckModelNameBytes("name", request.name(), limits_); !s.ok()) return s;
  absl::StatusOr<int64_t> version = oip::ParseVersion("version", request.version());
  if (!version.ok()) return version.status();
  // The version described: the one asked for, or the newest ready one.
  absl::StatusOr<ServableHandle> servable = repository_->Resolve(request.name(), *version);
  if (!servable.ok()) return servable.status();
  absl::StatusOr<ModelStatus> model = repository_->Get(request.name());
  if (!model.ok()) return model.status();
  const Model& m = *(*servable)->model;
  const Manifest& manifest = m.manifest();
  response->set_name(model->name);
  for (const VersionStatus& v : model->versions) {
    if (v.state == ModelState::kReady) response->add_versions(absl::StrCat(v.version));
  }
  response->set_platform(absl::StrCat("qvi_", m.format()));
  AddTensor(oip::InputSpec(), response->add_inputs());
  for (const TensorSpec& spec : oip::OutputSpecs(manifest)) AddTensor(spec, response->add_outputs());
  auto& p = *response->mutable_properties();
  p["version"] = absl::StrCat((*servable)->version);
  p["task"] = manifest.task == Task::kClassification ? "classification" : "tagging";
  p["display_name"] = manifest.display_name;
  p["architecture"] = manifest.architecture;
  p["interaction"] = manifest.interaction;
  p["description"] = manifest.description;
  p["device"] = m.device();
  p["max_tokens"] = absl::StrCat(manifest.tokenizer.max_tokens);
  p["explanations"] = nlohmann::json(manifest.explanations).dump();
  if (manifest.task == Task::kClassification) {
    p["labels"] = nlohmann::json(manifest.labels).dump();
  } else {
    p["tags"] = nlohmann::json(manifest.tags).dump();
    p["tag_scheme"] = manifest.tag_scheme;
    p["entity_types"] = nlohmann::json(manifest.entity_types).dump();
  }
  if (manifest.layers > 0) {
    p["layers"] = absl::StrCat(manifest.layers);
    p["heads"] = absl::StrCat(manifest.heads);
  }
  if (!manifest.model_card_json.empty()) p["model_card"] = manifest.model_card_json;
  // The card's faithfulness figures on their own (the same JSON as model_card.faithfulness), so that a
  // client need not dig them out of the card; GetModel carries them typed.
  p["faithfulness"] = manifest.faithfulness ? nlohmann::json::parse(manifest.model_card_json)["faithfulness"].dump()
                                            : std::string("not measured");
  return absl::OkStatus();
}

}  // namespace qvi

#include "server/frontend/native/request.h"

namespace qvi {

InferenceRequest FromProto(const v1::ModelSpec& model, const google::protobuf::RepeatedPtrField<std::string>& texts,
                           const v1::OutputOptions& options, const std::string& request_id, int priority) {
  InferenceRequest r;
  r.priority = static_cast<Priority>(priority);  // CheckRequest refuses a number that is none
  r.model = model.name();
  r.version = model.version();
  r.texts.assign(texts.begin(), texts.end());
  r.request_id = request_id;
  OutputOptions& o = r.options;
  o.top_k = options.top_k();
  const v1::LayerOptions& l = options.layers();
  // The API's switches, each turning on the outputs the catalogue gives it (outputs.h).
  const std::pair<bool, OutputSwitch> switches[] = {
      {options.attention(), OutputSwitch::kAttention},     {options.gates(), OutputSwitch::kGates},
      {options.tokens(), OutputSwitch::kTokens},           {l.gates(), OutputSwitch::kLayerGates},
      {l.attention_maps(), OutputSwitch::kLayerAttention}, {options.contributions(), OutputSwitch::kContributions},
      {options.occlusion(), OutputSwitch::kOcclusion}};
  for (const auto& [on, which] : switches) {
    if (on) o.Ask(which);
  }
  o.error_on_truncation = options.truncation() == v1::TRUNCATION_POLICY_ERROR;
  o.faithfulness_top_k = options.faithfulness().top_k();
  o.subwords = options.subwords();
  o.raw_scores = options.raw_scores();
  if (options.has_coverage()) o.coverage = options.coverage();
  if (options.has_abstain_below()) o.abstain_below = options.abstain_below();
  o.layers.layers.assign(l.layers().begin(), l.layers().end());
  o.layers.heads.assign(l.heads().begin(), l.heads().end());
  o.layers.reduction = l.reduction() == v1::LAYER_REDUCTION_MEAN_HEADS ? LayerSelection::Reduction::kMeanHeads
                       : l.reduction() == v1::LAYER_REDUCTION_MEAN_ALL ? LayerSelection::Reduction::kMeanAll
                                                                       : LayerSelection::Reduction::kNone;
  return r;
}

}  // namespace qvi

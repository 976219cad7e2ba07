#include "server/frontend/native/api.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/request/request_checks.h"

namespace qvi {

namespace {

// The native API's field for each per-token value and per-layer vector of the output catalogue
// (outputs.h names it, proto_field); ConvertTest keeps the two in step.
struct TokenField {
  Output output;
  void (v1::Token::*set)(float);
};
constexpr TokenField kTokenFields[] = {
    {Output::kAttention, &v1::Token::set_attention}, {Output::kSentenceAttention, &v1::Token::set_sentence_attention},
    {Output::kGates, &v1::Token::set_gate},          {Output::kSentenceGates, &v1::Token::set_sentence_gate},
    {Output::kLambdaQ, &v1::Token::set_lambda_q},    {Output::kLambdaK, &v1::Token::set_lambda_k},
};
struct LabelTokenField {
  Output output;
  google::protobuf::RepeatedField<float>* (v1::Token::*mutable_field)();
};
constexpr LabelTokenField kLabelTokenFields[] = {
    {Output::kContribution, &v1::Token::mutable_contribution},
    {Output::kSentenceContribution, &v1::Token::mutable_sentence_contribution},
    {Output::kOcclusion, &v1::Token::mutable_occlusion},
};
struct LayerField {
  Output output;
  google::protobuf::RepeatedField<float>* (v1::LayerMap::*mutable_field)();
};
constexpr LayerField kLayerFields[] = {
    {Output::kLayerGates, &v1::LayerMap::mutable_gates},
    {Output::kLayerLambdaQ, &v1::LayerMap::mutable_lambda_q},
    {Output::kLayerLambdaK, &v1::LayerMap::mutable_lambda_k},
    {Output::kLayerAttention, &v1::LayerMap::mutable_attention},
};

void TokensToProto(const std::vector<TokenOutput>& tokens, google::protobuf::RepeatedPtrField<v1::Token>* out) {
  out->Reserve(static_cast<int>(tokens.size()));
  for (const TokenOutput& t : tokens) {
    v1::Token* p = out->Add();
    p->set_text(t.token.text);
    p->set_start(t.token.start);
    p->set_end(t.token.end);
    p->set_byte_start(t.token.byte_start);
    p->set_byte_end(t.token.byte_end);
    p->set_normalized(t.token.normalized);
    p->set_id(static_cast<int32_t>(t.id));
    for (const TokenField& f : kTokenFields) {
      if (const std::optional<float>& v = t.*(Row(f.output).token_field)) (p->*f.set)(*v);
    }
    for (const LabelTokenField& f : kLabelTokenFields) {
      const std::vector<float>& values = t.*(Row(f.output).label_token_field);
      (p->*f.mutable_field)()->Add(values.begin(), values.end());
    }
    if (!t.tag.empty()) p->set_tag(t.tag);
    if (t.word) p->set_word(*t.word);
  }
}

void LayersToProto(const std::vector<LayerMapOutput>& layers, google::protobuf::RepeatedPtrField<v1::LayerMap>* out) {
  for (const LayerMapOutput& m : layers) {
    v1::LayerMap* p = out->Add();
    p->set_layer(m.layer);
    p->set_head(m.head);
    for (const LayerField& f : kLayerFields) {
      const std::vector<float>& values = m.*(Row(f.output).layer_field);
      (p->*f.mutable_field)()->Add(values.begin(), values.end());
    }
  }
}

void SetEstimate(const Estimate& e, v1::Estimate* out) {
  out->set_mean(e.mean);
  out->set_low(e.low);
  out->set_high(e.high);
}

// The model card's faithfulness figures, or "not measured" where it has none.
void SetFaithfulness(const std::optional<FaithfulnessCard>& card, v1::Faithfulness* out) {
  if (!card) {
    out->set_note("not measured: the model card has no faithfulness figures (python -m qvi faithfulness)");
    return;
  }
  out->set_measured(true);
  out->set_split(card->split);
  out->set_answers(card->answers);
  out->set_texts(card->texts);
  out->set_removal(card->removal);
  out->set_target(card->target);
  out->mutable_ks()->Add(card->ks.begin(), card->ks.end());
  for (const MethodFaithfulness& m : card->methods) {
    v1::MethodFaithfulness* p = out->add_methods();
    p->set_method(m.method);
    p->set_name(m.name);
    SetEstimate(m.comprehensiveness, p->mutable_comprehensiveness());
    SetEstimate(m.sufficiency, p->mutable_sufficiency());
    SetEstimate(m.normalised_comprehensiveness, p->mutable_normalised_comprehensiveness());
    if (m.loo_spearman) SetEstimate(*m.loo_spearman, p->mutable_loo_spearman());
    if (m.vs_random) {
      SetEstimate(*m.vs_random, p->mutable_vs_random());
      p->set_vs_random_p(m.vs_random_p);
    }
    if (m.cost) {
      v1::MethodCost* c = p->mutable_cost();
      c->set_ms_per_text_batch_1(m.cost->ms_per_text_batch_1);
      c->set_ms_per_text_batch_32(m.cost->ms_per_text_batch_32);
      c->set_extra_forwards_per_text(m.cost->extra_forwards_per_text);
    }
  }
  out->set_cost_machine(card->cost_machine);
}

}  // namespace

std::vector<Output> OutputsWithProtoFields() {
  std::vector<Output> out;
  for (const TokenField& f : kTokenFields) out.push_back(f.output);
  for (const LabelTokenField& f : kLabelTokenFields) out.push_back(f.output);
  for (const LayerField& f : kLayerFields) out.push_back(f.output);
  return out;
}

void ToProto(const InferenceResponse& in, v1::ClassifyResponse* out) {
  out->mutable_model()->set_name(in.model);
  out->mutable_model()->set_version(in.version);
  out->set_request_id(in.request_id);
  for (const TextResult& r : in.results) {
    v1::Classification* c = out->add_results();
    for (size_t j = 0; j < r.labels.size(); ++j) {
      v1::LabelScore* l = c->add_labels();
      l->set_label(r.labels[j].first);
      l->set_score(r.labels[j].second);
      if (j < r.margins.size()) l->set_margin(r.margins[j]);
      if (j < r.contribution_rest.size()) l->set_contribution_rest(r.contribution_rest[j]);
    }
    TokensToProto(r.tokens, c->mutable_tokens());
    c->set_truncated(r.truncated);
    c->set_num_tokens(r.num_tokens);
    LayersToProto(r.layers, c->mutable_layers());
    if (r.faithfulness) {
      v1::FaithfulnessCheck* f = c->mutable_faithfulness();
      f->set_label(r.faithfulness->label);
      f->set_score(r.faithfulness->score);
      f->set_score_without(r.faithfulness->score_without);
      f->mutable_removed()->Add(r.faithfulness->removed.begin(), r.faithfulness->removed.end());
    }
    if (r.label_set) {
      v1::LabelSet* set = c->mutable_label_set();
      set->set_coverage(r.label_set->coverage);
      set->set_min_probability(r.label_set->min_probability);
      for (const std::string& label : r.label_set->labels) set->add_labels(label);
    }
    c->set_abstained(r.abstained);
  }
}

void ToProto(const InferenceResponse& in, v1::TagResponse* out) {
  out->mutable_model()->set_name(in.model);
  out->mutable_model()->set_version(in.version);
  out->set_request_id(in.request_id);
  for (const TextResult& r : in.results) {
    v1::Tagging* t = out->add_results();
    for (const SpanOutput& s : r.spans) {
      v1::Span* p = t->add_spans();
      p->set_label(s.label);
      p->set_start(s.start);
      p->set_end(s.end);
      p->set_text(s.text);
      p->set_score(s.score);
      p->set_byte_start(s.byte_start);
      p->set_byte_end(s.byte_end);
      p->set_token_start(s.token_start);
      p->set_token_end(s.token_end);
      if (s.probability) p->set_probability(*s.probability);
      p->mutable_occlusion()->Add(s.occlusion.begin(), s.occlusion.end());
      p->set_abstained(s.abstained);
    }
    TokensToProto(r.tokens, t->mutable_tokens());
    t->set_truncated(r.truncated);
    t->set_num_tokens(r.num_tokens);
    LayersToProto(r.layers, t->mutable_layers());
  }
}

void ToProto(const ModelStatus& in, v1::ModelInfo* out) {
  out->set_name(in.name);
  for (const VersionStatus& v : in.versions) {
    v1::ModelVersion* p = out->add_versions();
    p->set_version(v.version);
    switch (v.state) {
      case ModelState::kLoading:
        p->set_state(v1::MODEL_STATE_LOADING);
        break;
      case ModelState::kReady:
        p->set_state(v1::MODEL_STATE_READY);
        break;
      case ModelState::kFailed:
        p->set_state(v1::MODEL_STATE_FAILED);
        break;
      case ModelState::kUnloading:
      case ModelState::kUnloaded:
        p->set_state(v1::MODEL_STATE_UNLOADING);
        break;
    }
    if (v.state != ModelState::kReady) p->set_reason(v.reason);
    if (!v.model) continue;
    const Manifest& m = v.model->manifest();
    v1::ModelMetadata* md = p->mutable_metadata();
    md->set_task(m.task == Task::kClassification ? "classification" : "tagging");
    md->set_architecture(m.architecture);
    md->set_display_name(m.display_name);
    md->set_interaction(m.interaction);
    md->set_description(m.description);
    for (const auto& l : m.labels) md->add_labels(l);
    for (const auto& t : m.tags) md->add_tags(t);
    md->set_tag_scheme(m.tag_scheme);
    for (const auto& e : m.entity_types) md->add_entity_types(e);
    v1::TokenizerInfo* tok = md->mutable_tokenizer();
    tok->set_level(m.tokenizer.level == TokenLevel::kChar      ? "char"
                   : m.tokenizer.level == TokenLevel::kSubword ? "subword"
                                                               : "word");
    tok->set_kind(m.tokenizer_kind);
    tok->set_word_tags(m.word_tags);
    tok->set_lowercase(m.tokenizer.lowercase);
    tok->set_casing(m.tokenizer.casing);
    tok->set_max_tokens(m.tokenizer.max_tokens);
    tok->set_vocab_size(m.vocab_size);
    for (const std::string& name : m.explanations) {
      v1::OutputInfo* o = md->add_outputs();
      o->set_name(name);
      auto it = m.outputs.find(name);
      if (it != m.outputs.end()) o->mutable_shape()->Add(it->second.begin(), it->second.end());
    }
    md->set_layers(m.layers);
    md->set_heads(m.heads);
    md->set_device(v.model->device());
    v1::BatchingInfo* b = md->mutable_batching();
    b->set_max_batch_size(v.serving.max_batch_size);
    b->set_max_batch_tokens(v.serving.max_batch_tokens);
    b->set_max_queue_delay_ms(v.serving.max_queue_delay_ms);
    b->set_priority_aging_ms(v.serving.priority_aging_ms);
    b->set_instances(v.serving.instances);
    b->set_batch_when_idle(v.serving.batching == BatchingMode::kWhenIdle);
    b->set_max_queued_texts(v.serving.max_queued_texts);
    b->set_max_queued_tokens(v.serving.max_queued_tokens);
    md->set_model_card_json(m.model_card_json);
    SetFaithfulness(m.faithfulness, md->mutable_faithfulness());
    md->set_format(v.model->format());
    md->set_format_note(v.model->fallback_reason());
    md->set_file(std::filesystem::path(v.model->file()).filename().string());
    md->set_precision(v.model->precision());
    const GraphReport& g = v.model->graphs();
    v1::CudaGraphInfo* gi = md->mutable_cuda_graphs();
    gi->set_active(g.active);
    gi->set_note(g.note);
    gi->mutable_batch_sizes()->Add(g.batch_sizes.begin(), g.batch_sizes.end());
    gi->mutable_lengths()->Add(g.lengths.begin(), g.lengths.end());
    gi->set_graphs(g.graphs);
    gi->set_capture_ms(g.capture_ms);
    gi->set_memory_bytes(g.memory_bytes);
  }
}

void ListModelsAnswer(const ModelRepository& repository, v1::ListModelsResponse* response) {
  for (const ModelStatus& m : repository.List()) ToProto(m, response->add_models());
}

void ToProto(const ShadowSummary& s, v1::ShadowComparison* out) {
  out->set_live_version(s.live_version);
  out->set_shadow_version(s.shadow_version);
  out->set_fraction(s.fraction);
  out->set_keep_texts(s.keep_texts);
  out->set_mirrored_texts(s.mirrored);
  out->set_compared_texts(s.compared);
  for (const auto& [reason, texts] : s.dropped) (*out->mutable_dropped_texts())[reason] = texts;
  out->set_label_agreement(s.label_agreement());
  for (const auto& [labels, texts] : s.flips) {
    v1::ShadowComparison::Flip* flip = out->add_flips();
    flip->set_from(labels.first);
    flip->set_to(labels.second);
    flip->set_texts(texts);
  }
  if (std::optional<double> f1 = s.span_f1()) out->set_span_f1(*f1);
  if (std::optional<double> rho = s.mean_rank_correlation()) out->set_mean_rank_correlation(*rho);
  if (std::optional<double> d = s.mean_score_difference()) {
    out->set_mean_score_difference(*d);
    out->set_mean_abs_score_difference(s.abs_score_difference_sum / static_cast<double>(s.score_differences));
  }
  if (std::optional<double> ms = s.mean_latency_difference_ms()) out->set_mean_latency_difference_ms(*ms);
  for (const ShadowSummary::Disagreement& d : s.disagreements) {
    v1::ShadowComparison::Disagreement* w = out->add_disagreements();
    w->set_text(d.text);
    w->set_text_sha256(d.text_sha256);
    const TextComparison& c = d.comparison;
    w->set_live_label(c.live_label);
    w->set_shadow_label(c.shadow_label);
    if (c.score_difference) w->set_score_difference(*c.score_difference);
    if (c.rank_correlation) w->set_rank_correlation(*c.rank_correlation);
    w->set_live_spans(c.live_spans);
    w->set_shadow_spans(c.shadow_spans);
    w->set_same_spans(c.same_spans);
  }
}

absl::Status GetModelAnswer(const ModelRepository& repository, const RequestLimits& limits,
                            const v1::GetModelRequest& request, v1::GetModelResponse* response,
                            const std::vector<ShadowSummary>& shadow) {
  const std::string& name = request.model().name();
  if (absl::Status s = CheckModelNameBytes("model.name", name, limits); !s.ok()) return s;
  absl::StatusOr<ModelStatus> m = repository.Get(name);
  if (!m.ok()) return m.status();
  if (const int64_t want = request.model().version(); want != 0) {
    std::vector<VersionStatus> keep;
    for (VersionStatus& v : m->versions) {
      if (v.version == want) keep.push_back(std::move(v));
    }
    if (keep.empty()) return absl::NotFoundError(absl::StrCat("model '", m->name, "' has no version ", want));
    m->versions = std::move(keep);
  }
  ToProto(*m, response->mutable_model());
  for (const ShadowSummary& s : shadow) ToProto(s, response->add_shadow());
  return absl::OkStatus();
}

}  // namespace qvi

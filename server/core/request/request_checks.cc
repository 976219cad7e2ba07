#include "server/core/request/request_checks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/core/text/tokenizer.h"

namespace qvi {

absl::Status CheckModelNameBytes(const char* field, const std::string& name, const RequestLimits& limits) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty; name the model to use"));
  if (static_cast<int64_t>(name.size()) <= limits.max_model_name_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", name.size(), " bytes exceed the limit of ", limits.max_model_name_bytes, " bytes"));
}

absl::Status CheckRequest(const InferenceRequest& r, const RequestLimits& limits) {
  if (absl::Status s = CheckModelNameBytes("model.name", r.model, limits); !s.ok()) return s;
  if (static_cast<int64_t>(r.request_id.size()) > limits.max_request_id_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id: ", r.request_id.size(), " bytes exceed the limit of ",
                                                   limits.max_request_id_bytes, " bytes"));
  }
  if (r.version < 0)
    return absl::InvalidArgumentError(absl::StrCat("model.version: ", r.version, " is negative; use 0 for the newest"));
  if (r.texts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("texts: empty; send between 1 and ", limits.max_texts, " texts"));
  }
  if (static_cast<int>(r.texts.size()) > limits.max_texts) {
    return absl::InvalidArgumentError(
        absl::StrCat("texts: ", r.texts.size(), " texts exceed the limit of ", limits.max_texts, " per request"));
  }
  for (size_t i = 0; i < r.texts.size(); ++i) {
    if (static_cast<int>(r.texts[i].size()) > limits.max_text_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: ", r.texts[i].size(),
                                                     " bytes exceed the limit of ", limits.max_text_bytes, " bytes"));
    }
    absl::Status utf8 = ValidateUtf8(r.texts[i]);
    if (!utf8.ok()) return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: ", utf8.message()));
  }
  if (!IsPriority(r.priority)) {
    return absl::InvalidArgumentError(absl::StrCat("priority: ", static_cast<int>(r.priority),
                                                   " is not a priority; it takes 0 (the default), 1 (high), "
                                                   "2 (normal) or 3 (low)"));
  }
  if (r.options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.top_k: ", r.options.top_k, " is negative; 0 returns the best label"));
  }
  if (r.options.faithfulness_top_k < 0 || r.options.faithfulness_top_k > kMaxFaithfulnessTopK) {
    return absl::InvalidArgumentError(absl::StrCat("options.faithfulness.top_k: ", r.options.faithfulness_top_k,
                                                   " is outside [0, ", kMaxFaithfulnessTopK, "]; 0 = no check"));
  }
  return absl::OkStatus();
}

// Layer or head indices: at most `count` of them (the model has no more), each in range, none
// repeated. Checked in that order, so that a long list is refused before it is walked.
absl::Status CheckIndices(const char* field, const std::vector<int>& indices, int count, const char* what) {
  if (static_cast<int64_t>(indices.size()) > count) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", indices.size(), " indices exceed the model's ", count,
                                                   " ", what, "; name each at most once"));
  }
  std::vector<int> first(count, -1);  // where each index was first named
  for (size_t i = 0; i < indices.size(); ++i) {
    const int v = indices[i];
    if (v < 0 || v >= count) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: ", v, " is out of range [0, ", count, ")"));
    }
    if (first[v] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: ", v, " repeats ", field, "[", first[v], "]; name each at most once"));
    }
    first[v] = static_cast<int>(i);
  }
  return absl::OkStatus();
}

std::string Capped(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
  return absl::StrCat(s.substr(0, cut), "...(", s.size(), " bytes)");
}

int64_t LayerMapsPerText(const Manifest& m, const OutputOptions& o) {
  if (!o.AsksLayers()) return 0;
  const LayerSelection& l = o.layers;
  const int64_t layers = l.layers.empty() ? m.layers : static_cast<int64_t>(l.layers.size());
  const int64_t heads = l.heads.empty() ? m.heads : static_cast<int64_t>(l.heads.size());
  return l.reduction == LayerSelection::Reduction::kMeanAll     ? 1
         : l.reduction == LayerSelection::Reduction::kMeanHeads ? layers
                                                                : layers * heads;
}

namespace {
// How many labels a Classify answer carries.
int64_t ClassifyLabels(const Manifest& m, const OutputOptions& o) {
  return std::min<int64_t>(std::max(o.top_k, 1), static_cast<int64_t>(m.labels.size()));
}
// Whether the answer keeps its tokens: a tagger's always, others' when anything per token is asked (or
// a sub-word model's sub-word view).
bool KeepsTokens(Method method, const Manifest& m, const OutputOptions& o) {
  return method == Method::kTag || o.AsksPerToken() || (o.subwords && m.subwords());
}

}  // namespace

namespace {

// A classification's answer beyond its tokens: `labels` labels of up to `longest_label` bytes, and what the
// options add.
int64_t ClassificationBytes(const Manifest& m, const OutputOptions& o, int64_t labels, int64_t longest_label) {
  int64_t bytes = labels * (longest_label + 8);
  // options.contributions: each label's margin and rest.
  if (o.Asks(OutputSwitch::kContributions)) bytes += labels * 10;
  // options.faithfulness: the label, two floats and at most top_k indices of up to 5 bytes.
  if (o.faithfulness_top_k > 0) bytes += longest_label + 16 + 5 * o.faithfulness_top_k;
  // options.coverage: at most every label, two doubles; options.abstain_below: a flag.
  if (o.coverage) bytes += static_cast<int64_t>(m.labels.size()) * (longest_label + 2) + 24;
  if (o.abstain_below) bytes += 2;
  return bytes;
}

}  // namespace

int64_t EstimateResponseBytes(Method method, const Manifest& m, const InferenceRequest& r,
                              const InferenceResponse& response) {
  const OutputOptions& o = r.options;
  size_t longest_label = 0;
  for (const std::string& label : method == Method::kClassify ? m.labels : m.tags) {
    longest_label = std::max(longest_label, label.size());
  }
  const bool keep_tokens = KeepsTokens(method, m, o);
  // Per-layer maps per text, each T gates per gate output and T x T attention.
  const int64_t maps = LayerMapsPerText(m, o);
  const int64_t gate_outputs =
      o.AsksLayers() && o.Asks(OutputSwitch::kLayerGates)
          ? static_cast<int64_t>((OutputsOfModel(m) & SwitchedBy(OutputSwitch::kLayerGates)).count())
          : 0;
  int64_t bytes = 64 + static_cast<int64_t>(r.model.size() + r.request_id.size());
  const int64_t labels = ClassifyLabels(m, o);
  for (size_t i = 0; i < response.results.size(); ++i) {
    const TextResult& t = response.results[i];
    const int64_t n = static_cast<int64_t>(t.tokens.size());
    bytes += 16;
    if (method == Method::kClassify) {
      bytes += ClassificationBytes(m, o, labels, static_cast<int64_t>(longest_label));
    } else {
      // Spans: at most one per token, each with its label, offsets, score, text and abstention.
      bytes += n * static_cast<int64_t>(longest_label + 34) + static_cast<int64_t>(r.texts[i].size());
    }
    if (keep_tokens) {
      for (const TokenOutput& token : t.tokens) {
        bytes += 32 + static_cast<int64_t>(token.token.text.size() + token.token.normalized.size() + longest_label);
        // 5 bytes (tag and float) for each per-token value of the switches turned on.
        for (OutputSwitch on : {OutputSwitch::kAttention, OutputSwitch::kGates}) {
          if (o.Asks(on)) bytes += 5 * static_cast<int64_t>(SwitchedBy(on).count());
        }
        // options.contributions: a float per returned label, for the token and for its sentence.
        if (o.Asks(OutputSwitch::kContributions)) bytes += 2 * (4 + 4 * labels);
        // options.tag_probabilities (Tag): a float per tag.
        if (method == Method::kTag && o.tag_probabilities) bytes += 5 * static_cast<int64_t>(m.tags.size());
        // options.occlusion (Classify): a float per returned label.
        if (method == Method::kClassify && o.Asks(OutputSwitch::kOcclusion)) bytes += 4 + 4 * labels;
      }
    }
    // options.occlusion (Tag): per entity (at most one per token) its probability and a float per token.
    if (method == Method::kTag && o.Asks(OutputSwitch::kOcclusion)) bytes += n * (12 + 4 * n);
    bytes += maps * (8 + gate_outputs * (4 * n + 4) + (o.Asks(OutputSwitch::kLayerAttention) ? 4 * n * n + 4 : 0));
  }
  return bytes;
}

OutputSet WantedOutputs(const Manifest& m, const OutputOptions& o) {
  OutputSet wanted = AnswerTensors(m.task);
  for (OutputSwitch on : {OutputSwitch::kAttention, OutputSwitch::kGates, OutputSwitch::kLayerGates,
                          OutputSwitch::kLayerAttention, OutputSwitch::kContributions}) {
    if (o.Asks(on)) wanted |= ModelTensors(SwitchedBy(on));
  }
  if (o.faithfulness_top_k > 0) wanted.set(static_cast<size_t>(Output::kAttention));  // the check ranks by α
  return wanted;
}

void ApplyServingDefaults(const ServingConfig& serving, OutputOptions& o) {
  if (!o.abstain_below && !o.raw_scores) o.abstain_below = serving.abstain_below;
}

}  // namespace qvi

#include "server/core/outputs/outputs.h"

#include <cstdlib>

#include "server/core/outputs/answer.h"
#include "server/core/outputs/answer_tensors.h"

namespace qvi {
namespace {

using K = OutputKind;
using S = OutputSwitch;
using F = TaskFilter;
namespace t = tensors;

std::vector<OutputRow> MakeCatalogue() {
  // clang-format off
  // id, name, kind, switch, task, model shape, int64, wire datatype, wire shape, requires,
  // token field, layer field, proto field, per-label token field, writer, bytes
  std::vector<OutputRow> rows = {
    {Output::kLogits, "logits", K::kAnswer, S::kAnswer, F::kClassification, "B,C", false, nullptr, nullptr,
     std::nullopt, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr},
    {Output::kEmissions, "emissions", K::kAnswer, S::kAnswer, F::kTagging, "B,T,K", false, nullptr, nullptr,
     std::nullopt, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr},
    {Output::kLabel, "label", K::kAnswer, S::kAnswer, F::kClassification, nullptr, false, "BYTES", "N",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::Label, t::LabelBytes},
    {Output::kProbabilities, "probabilities", K::kAnswer, S::kAnswer, F::kClassification, nullptr, false, "FP32",
     "N,C", std::nullopt, nullptr, nullptr, nullptr, nullptr, t::Probabilities, t::ProbabilitiesBytes},
    {Output::kLabels, "labels", K::kAnswer, S::kNamed, F::kClassification, nullptr, false, "BYTES", "N,K",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::TopLabels, t::TopLabelsBytes},
    {Output::kScores, "scores", K::kAnswer, S::kNamed, F::kClassification, nullptr, false, "FP32", "N,K",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::TopScores, t::TopScoresBytes},
    {Output::kSpans, "spans", K::kAnswer, S::kAnswer, F::kTagging, nullptr, false, "BYTES", "N",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::Spans, t::SpansBytes},
    {Output::kTags, "tags", K::kPerToken, S::kAnswer, F::kTagging, "B,T", true, "BYTES", "N,T",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::TagNames, t::TagNamesBytes},
    {Output::kTokens, "tokens", K::kPerToken, S::kTokens, F::kBoth, nullptr, false, "BYTES", "N,T",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::TokenTexts, t::TokenTextsBytes},
    {Output::kTokenCount, "token_count", K::kAnswer, S::kAnyToken, F::kBoth, nullptr, false, "INT32", "N",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::TokenCount, t::PerTextBytes4},
    {Output::kTruncated, "truncated", K::kAnswer, S::kNamed, F::kBoth, nullptr, false, "BOOL", "N",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::Truncated, t::PerTextBytes1},
    {Output::kWordIndex, "word_index", K::kPerToken, S::kAnyToken, F::kBoth, nullptr, false, "INT32", "N,T",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::WordIndex, t::PerTokenBytes},
    {Output::kAttention, "attention", K::kPerToken, S::kAttention, F::kBoth, "B,T", false, "FP32", "N,T",
     Output::kAttention, &TokenOutput::attention, nullptr, "attention", nullptr, t::PerToken, t::PerTokenBytes},
    {Output::kSentenceAttention, "sentence_attention", K::kPerToken, S::kAttention, F::kBoth, "B,T", false, "FP32",
     "N,T", Output::kSentenceAttention, &TokenOutput::sentence_attention, nullptr, "sentence_attention",
     nullptr, t::PerToken, t::PerTokenBytes},
    {Output::kGates, "gates", K::kPerToken, S::kGates, F::kBoth, "B,T", false, "FP32", "N,T",
     Output::kGates, &TokenOutput::gate, nullptr, "gate", nullptr, t::PerToken, t::PerTokenBytes},
    {Output::kSentenceGates, "sentence_gates", K::kPerToken, S::kGates, F::kBoth, "B,T", false, "FP32", "N,T",
     Output::kSentenceGates, &TokenOutput::sentence_gate, nullptr, "sentence_gate", nullptr, t::PerToken, t::PerTokenBytes},
    {Output::kLambdaQ, "lambda_q", K::kPerToken, S::kGates, F::kBoth, "B,T", false, "FP32", "N,T",
     Output::kLambdaQ, &TokenOutput::lambda_q, nullptr, "lambda_q", nullptr, t::PerToken, t::PerTokenBytes},
    {Output::kLambdaK, "lambda_k", K::kPerToken, S::kGates, F::kBoth, "B,T", false, "FP32", "N,T",
     Output::kLambdaK, &TokenOutput::lambda_k, nullptr, "lambda_k", nullptr, t::PerToken, t::PerTokenBytes},
    {Output::kContribution, "contribution", K::kPerToken, S::kContributions, F::kClassification, "B,T,C", false,
     "FP32", "N,K,T", Output::kContribution, nullptr, nullptr, "contribution", &TokenOutput::contribution,
     t::PerLabelToken, t::PerLabelTokenBytes},
    {Output::kSentenceContribution, "sentence_contribution", K::kPerToken, S::kContributions, F::kClassification,
     "B,T,C", false, "FP32", "N,K,T", Output::kSentenceContribution, nullptr, nullptr, "sentence_contribution",
     &TokenOutput::sentence_contribution, t::PerLabelToken, t::PerLabelTokenBytes},
    {Output::kMargin, "margin", K::kAnswer, S::kContributions, F::kClassification, nullptr, false, "FP32", "N,K",
     Output::kContribution, nullptr, nullptr, nullptr, nullptr, t::Margins, t::PerLabelBytes},
    {Output::kContributionRest, "contribution_rest", K::kAnswer, S::kContributions, F::kClassification, nullptr,
     false, "FP32", "N,K", Output::kContribution, nullptr, nullptr, nullptr, nullptr, t::ContributionRests,
     t::PerLabelBytes},
    {Output::kOcclusion, "occlusion", K::kPerToken, S::kOcclusion, F::kClassification, nullptr, false, "FP32",
     "N,K,T", std::nullopt, nullptr, nullptr, "occlusion", &TokenOutput::occlusion, t::PerLabelToken,
     t::PerLabelTokenBytes},
    {Output::kEntityOcclusion, "entity_occlusion", K::kAnswer, S::kOcclusion, F::kTagging, nullptr, false, "FP32",
     "N,S,T", std::nullopt, nullptr, nullptr, nullptr, nullptr, t::EntityOcclusion, t::EntityOcclusionBytes},
    {Output::kLayerIndex, "layer_index", K::kPerLayer, S::kAnyLayer, F::kBoth, nullptr, false, "INT32", "M,2",
     Output::kLayerAttention, nullptr, nullptr, nullptr, nullptr, t::LayerIndex, t::LayerIndexBytes},
    {Output::kLayerGates, "layer_gates", K::kPerLayer, S::kLayerGates, F::kBoth, "B,L,H,T", false, "FP32", "N,M,T",
     Output::kLayerGates, nullptr, &LayerMapOutput::gates, "gates", nullptr, t::PerLayer, t::PerLayerBytes},
    {Output::kLayerLambdaQ, "layer_lambda_q", K::kPerLayer, S::kLayerGates, F::kBoth, "B,L,H,T", false, "FP32",
     "N,M,T", Output::kLayerLambdaQ, nullptr, &LayerMapOutput::lambda_q, "lambda_q", nullptr, t::PerLayer, t::PerLayerBytes},
    {Output::kLayerLambdaK, "layer_lambda_k", K::kPerLayer, S::kLayerGates, F::kBoth, "B,L,H,T", false, "FP32",
     "N,M,T", Output::kLayerLambdaK, nullptr, &LayerMapOutput::lambda_k, "lambda_k", nullptr, t::PerLayer, t::PerLayerBytes},
    {Output::kLayerAttention, "layer_attention", K::kPerLayerMap, S::kLayerAttention, F::kBoth, "B,L,H,T,T", false,
     "FP32", "N,M,T,T", Output::kLayerAttention, nullptr, &LayerMapOutput::attention, "attention", nullptr,
     t::PerLayerMap, t::PerLayerMapBytes},
    {Output::kFaithfulnessLabel, "faithfulness_label", K::kAnswer, S::kFaithfulness, F::kClassification, nullptr,
     false, "BYTES", "N", Output::kAttention, nullptr, nullptr, nullptr, nullptr, t::FaithfulnessLabel, t::LabelBytes},
    {Output::kFaithfulnessScore, "faithfulness_score", K::kAnswer, S::kFaithfulness, F::kClassification, nullptr,
     false, "FP32", "N", Output::kAttention, nullptr, nullptr, nullptr, nullptr, t::FaithfulnessScore, t::PerTextBytes4},
    {Output::kFaithfulnessScoreWithout, "faithfulness_score_without", K::kAnswer, S::kFaithfulness,
     F::kClassification, nullptr, false, "FP32", "N", Output::kAttention, nullptr, nullptr, nullptr,
     nullptr, t::FaithfulnessScoreWithout, t::PerTextBytes4},
    {Output::kFaithfulnessRemoved, "faithfulness_removed", K::kAnswer, S::kFaithfulness, F::kClassification, nullptr,
     false, "INT32", "N,R", Output::kAttention, nullptr, nullptr, nullptr, nullptr,
     t::FaithfulnessRemoved, t::FaithfulnessRemovedBytes},
    {Output::kLabelSet, "label_set", K::kAnswer, S::kCoverage, F::kClassification, nullptr, false, "BYTES", "N",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::LabelSets, t::LabelSetBytes},
    {Output::kAbstained, "abstained", K::kAnswer, S::kAbstention, F::kClassification, nullptr, false, "BOOL", "N",
     std::nullopt, nullptr, nullptr, nullptr, nullptr, t::Abstained, t::PerTextBytes1},
  };
  // clang-format on
  // The enum and the table agree row for row: a row out of place is a programming error.
  for (size_t i = 0; i < rows.size(); ++i) {
    if (static_cast<size_t>(rows[i].id) != i) std::abort();
  }
  if (rows.size() != kOutputCount) std::abort();
  return rows;
}

OutputSet Where(bool (*keep)(const OutputRow&, int), int arg) {
  OutputSet set;
  for (const OutputRow& row : OutputCatalogue()) set[static_cast<size_t>(row.id)] = keep(row, arg);
  return set;
}

}  // namespace

const std::vector<OutputRow>& OutputCatalogue() {
  static const std::vector<OutputRow> rows = MakeCatalogue();
  return rows;
}

const OutputRow& Row(Output output) { return OutputCatalogue()[static_cast<size_t>(output)]; }

std::optional<Output> OutputNamed(std::string_view name) {
  for (const OutputRow& row : OutputCatalogue()) {
    if (name == row.name) return row.id;
  }
  return std::nullopt;
}

OutputSet SwitchedBy(OutputSwitch on) {
  static const auto sets = [] {
    std::vector<OutputSet> out(kOutputSwitchCount);
    for (const OutputRow& row : OutputCatalogue()) out[static_cast<size_t>(row.on)].set(static_cast<size_t>(row.id));
    return out;
  }();
  return sets[static_cast<size_t>(on)];
}

OutputSet OfKind(OutputKind kind) {
  return Where([](const OutputRow& row, int k) { return static_cast<int>(row.kind) == k; }, static_cast<int>(kind));
}

bool ForTask(const OutputRow& row, Task task) {
  return row.task == TaskFilter::kBoth || (row.task == TaskFilter::kClassification) == (task == Task::kClassification);
}

OutputSet AnswerTensors(Task task) {
  return Where(
      [](const OutputRow& row, int task) {
        return row.on == OutputSwitch::kAnswer && row.model_shape != nullptr && ForTask(row, static_cast<Task>(task));
      },
      static_cast<int>(task));
}

OutputSet ModelTensors(const OutputSet& set) {
  static const OutputSet model = Where([](const OutputRow& row, int) { return row.model_shape != nullptr; }, 0);
  return set & model;
}

SwitchNames NamesOf(OutputSwitch on) {
  switch (on) {
    case OutputSwitch::kTokens:
      return {"tokens", "options.tokens"};
    case OutputSwitch::kAttention:
      return {"attention", "options.attention"};
    case OutputSwitch::kGates:
      return {"gates", "options.gates"};
    case OutputSwitch::kLayerGates:
      return {"layer_gates", "options.layers.gates"};
    case OutputSwitch::kLayerAttention:
      return {"layer_attention", "options.layers.attention_maps"};
    case OutputSwitch::kContributions:
      return {"contributions", "options.contributions"};
    case OutputSwitch::kOcclusion:
      return {"occlusion", "options.occlusion"};
    default:
      return {nullptr, nullptr};
  }
}

std::optional<OutputSwitch> SwitchParameter(std::string_view name) {
  // The switches of the catalogue's rows: a row with a new switch is found here once NamesOf names it.
  for (const OutputRow& row : OutputCatalogue()) {
    const char* parameter = NamesOf(row.on).parameter;
    if (parameter != nullptr && name == parameter) return row.on;
  }
  return std::nullopt;
}

OutputSet OutputsOf(std::initializer_list<Output> outputs) {
  OutputSet set;
  for (Output o : outputs) set.set(static_cast<size_t>(o));
  return set;
}

std::vector<Output> InOrder(const OutputSet& set) {
  std::vector<Output> out;
  for (size_t i = 0; i < kOutputCount; ++i) {
    if (set[i]) out.push_back(static_cast<Output>(i));
  }
  return out;
}

OutputSet OutputsOfModel(const Manifest& m) {
  OutputSet set;
  for (const auto& [name, shape] : m.outputs) {
    if (std::optional<Output> o = OutputNamed(name); o && Row(*o).model_shape != nullptr)
      set.set(static_cast<size_t>(*o));
  }
  return set;
}

}  // namespace qvi

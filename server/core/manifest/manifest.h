// The model's own facts, read from manifest.json inside the artifact (format in model_store/README.md).
#ifndef QVI_SERVER_CORE_MANIFEST_MANIFEST_H_
#define QVI_SERVER_CORE_MANIFEST_MANIFEST_H_

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/sched/defaults.h"
#include "server/core/text/tokenizer.h"

namespace qvi {

enum class Task { kClassification, kTagging };

// A manifest's `serving` block: the batching its exporter suggests (defaults.h when it says nothing);
// its `cuda` block, the batching on a GPU.
struct BatchingDefaults {
  int max_batch_size = defaults::kMaxBatchSize;
  int max_batch_tokens = defaults::kMaxBatchTokens;
  double max_queue_delay_ms = defaults::kMaxQueueDelayMs;
};

// The batching a version on a GPU starts from when its manifest has no `serving.cuda` block.
inline BatchingDefaults GpuBatchingDefaults() {
  return {defaults::kGpuMaxBatchSize, defaults::kGpuMaxBatchTokens, defaults::kMaxQueueDelayMs};
}

// A mean over a model's test answers with its 95 % bootstrap interval.
struct Estimate {
  double mean = 0;
  double low = 0;
  double high = 0;
};

// What one method's explanation costs on the card's machine (FaithfulnessCard::cost_machine): wall ms
// per text alone and in batches of 32, and the forward passes beyond the answer's own.
struct MethodCost {
  double ms_per_text_batch_1 = 0;
  double ms_per_text_batch_32 = 0;
  double extra_forwards_per_text = 0;
};

// One explanation method's faithfulness figures (ERASER; model_store/qvi/faithfulness.py).
struct MethodFaithfulness {
  std::string method;  // "alpha", "random", ...
  std::string name;    // "α", ...
  Estimate comprehensiveness;
  Estimate sufficiency;
  Estimate normalised_comprehensiveness;
  std::optional<Estimate> loo_spearman;
  std::optional<Estimate> vs_random;
  double vs_random_p = 1.0;
  std::optional<MethodCost> cost;  // absent: the card measured none
};

// model_card.faithfulness, written at export by `python -m qvi faithfulness`.
struct FaithfulnessCard {
  std::string split;
  int answers = 0;
  int texts = 0;
  std::string removal;
  std::string target;
  std::vector<int> ks;
  std::vector<MethodFaithfulness> methods;
  std::string cost_machine;  // where the methods' costs were measured; empty without costs
};

// One coverage level of a classifier's split-conformal label sets: a label joins the set when its
// calibrated probability is at least `min_probability`; `coverage` is what the card's test split got.
struct ConformalLevel {
  double coverage_target = 0;
  double min_probability = 0;
  double coverage = 0;
};

// model_card.calibration, written at export by `python -m qvi calibrate` (model_store/qvi/calibration.py):
// the temperature the server divides a classifier's logits (a tagger's CRF potentials) by, fitted on
// `fitted_on`, and what it measured on `measured_on`.
struct CalibrationCard {
  double temperature = 1.0;
  std::string fitted_on, measured_on;
  double ece_before = 0, ece_after = 0, brier_before = 0, brier_after = 0;
  std::vector<ConformalLevel> conformal;  // classifiers; ascending coverage
};

// Shares of a split in bins: bin b holds the values with exactly b of the (ascending) `edges` at or below them.
struct BinnedShares {
  std::vector<double> edges;
  std::vector<double> shares;  // edges.size() + 1
  size_t Bin(double x) const { return std::upper_bound(edges.begin(), edges.end(), x) - edges.begin(); }
};

// model_card.drift_reference, written at export by `python -m qvi drift-reference` (model_store/qvi/drift.py):
// how the model's inputs and answers look on its test split, which the drift gauges (serving/drift.h) compare
// live traffic with.
struct DriftReference {
  std::string split;
  int64_t texts = 0;
  std::map<std::string, double> labels;  // a classifier's top labels; a tagger's entities by type
  BinnedShares length;                   // tokens read per text
  BinnedShares confidence;               // each answer's calibrated probability, at `temperature`
  double temperature = 1.0;
  double unknown = 0;  // the share of the tokens read that the vocabulary does not know
  double below_threshold = 0, below_share = 0;
};

struct Manifest {
  // 2 added sub-word tokenizers (tokenizer.level "subword", its file inside the artifact); a server
  // reads every version up to kFormatVersion.
  static constexpr int kFormatVersion = 2;

  std::string name;
  Task task = Task::kClassification;
  std::string architecture;
  std::string display_name;
  std::string interaction;
  std::string description;
  std::vector<std::string> labels;  // classification
  std::vector<std::string> tags;    // tagging
  std::string tag_scheme;           // BIO | BIOES
  std::vector<std::string> entity_types;
  TokenizerOptions tokenizer;
  // A sub-word tokenizer's file inside the artifact ("tokenizer.json") and its model's kind
  // ("WordPiece"); empty for the word and character tokenizers.
  std::string tokenizer_file;
  std::string tokenizer_kind;
  // How a sub-word tagger's words take their tag: "first_subword" (the only scheme served), the
  // labelling its training used; empty otherwise.
  std::string word_tags;
  int vocab_size = 0;
  std::map<std::string, std::vector<std::string>> outputs;  // name -> symbolic shape
  std::vector<std::string> explanations;
  int layers = 0;  // Transformer layers and heads (0 without self-attention)
  int heads = 0;
  BatchingDefaults serving;                      // on the CPU
  std::optional<BatchingDefaults> serving_cuda;  // on a GPU; absent: GpuBatchingDefaults()
  std::string model_card_json;
  std::optional<FaithfulnessCard> faithfulness;   // absent: not measured
  std::optional<CalibrationCard> calibration;     // absent: scores are the raw softmax (marginals)
  std::optional<DriftReference> drift_reference;  // absent: no drift gauges

  // The temperature an answer's scores are computed at: the card's, or 1 with `raw` or without one.
  double ScoreTemperature(bool raw) const { return raw || !calibration ? 1.0 : calibration->temperature; }

  // Whether the model computes the output of this name (outputs.h: HasOutput of a catalogue row).
  bool HasOutput(const std::string& name) const { return outputs.count(name) > 0; }
  bool subwords() const { return tokenizer.level == TokenLevel::kSubword; }

  // Parses and checks a manifest; errors name the field and what was wrong with it.
  static absl::StatusOr<Manifest> Parse(std::string_view json);
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MANIFEST_MANIFEST_H_

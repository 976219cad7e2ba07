// The core's answer types: what an answer holds for each text (labels, spans, tokens with their
// explanation values, per-layer maps) and for the call. They mirror the public API (proto/) without
// depending on it. The output catalogue (outputs.h) points at their fields, one row per output.
#ifndef QVI_SERVER_CORE_OUTPUTS_ANSWER_H_
#define QVI_SERVER_CORE_OUTPUTS_ANSWER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/core/text/tokenizer.h"

namespace qvi {

struct Manifest;

struct TokenOutput {
  TextToken token;
  int64_t id = 0;
  std::optional<float> attention;
  std::optional<float> gate;
  std::optional<float> sentence_attention;
  std::optional<float> sentence_gate;
  std::optional<float> lambda_q;
  std::optional<float> lambda_k;
  // options.contributions: the token's share of each returned label's margin, in the labels' order
  // (HAN: and its sentence's share).
  std::vector<float> contribution;
  std::vector<float> sentence_contribution;
  // options.occlusion (Classify): the drop in each returned label's probability without this token.
  std::vector<float> occlusion;
  std::string tag;
  // options.tag_probabilities (Tag): p(tag k here) for each of the manifest's tags.
  std::vector<float> tag_probabilities;
  // A sub-word model's sub-word (options.subwords): the word of the text it belongs to, -1 for a
  // special token; its vocabulary spelling is token.normalized. Unset for a word.
  std::optional<int32_t> word;
};

// A sub-word model's word: one piece of its pre-tokenizer, read as the model's positions [first, end)
// (the sub-words of TextResult::tokens before the answer groups them).
struct WordPieces {
  TextToken token;
  uint32_t first = 0, end = 0;
};

struct SpanOutput {
  std::string label;
  uint32_t start = 0, end = 0;  // code points
  uint32_t byte_start = 0, byte_end = 0;
  uint32_t token_start = 0, token_end = 0;
  std::string text;
  float score = 0;
  // options.occlusion: the entity's probability (mean CRF marginal of its tags) and, per token of
  // the text, its drop when that token is deleted (0 on the entity's own tokens).
  std::optional<float> probability;
  std::vector<float> occlusion;
  bool abstained = false;  // options.abstain_below: its score is below
};

// options.coverage: the labels whose calibrated probability is at least the card's threshold for the
// coverage asked for (trust.h), most probable first.
struct LabelSetOutput {
  double coverage = 0;
  double min_probability = 0;
  std::vector<std::string> labels;
};

struct LayerMapOutput {
  int layer = -1;
  int head = -1;
  std::vector<float> gates, lambda_q, lambda_k;
  std::vector<float> attention;  // T x T, row-major
};

// options.faithfulness's answer: the top label's probability as answered and without α's top tokens.
struct FaithfulnessCheckOutput {
  std::string label;
  float score = 0;
  float score_without = 0;
  std::vector<uint32_t> removed;  // token indices, ascending
};

struct TextResult {
  std::vector<std::pair<std::string, float>> labels;  // classification, best first
  // options.contributions, one per label above: its logit margin over the mean of the others, and
  // the part of it no token carries (margin = Σ tokens' contribution + rest).
  std::vector<float> margins;
  std::vector<float> contribution_rest;
  std::vector<SpanOutput> spans;  // tagging
  std::vector<TokenOutput> tokens;
  // A sub-word model's words (empty for other models). Until the answer is post-processed, `tokens`
  // holds the sub-words the model reads, special tokens included; then the words, unless the request
  // asked for the sub-words (options.subwords).
  std::vector<WordPieces> words;
  bool truncated = false;
  uint32_t num_tokens = 0;
  // What the vocabulary makes of the text, for the drift gauges (serving/drift.h): a word-level model's tokens
  // read and those it does not know ([UNK]); a sub-word model's words read and those it does not hold whole
  // (split into two or more sub-words).
  uint32_t vocab_units = 0, vocab_unknown = 0;
  std::vector<LayerMapOutput> layers;
  std::optional<FaithfulnessCheckOutput> faithfulness;
  std::optional<LabelSetOutput> label_set;
  bool abstained = false;  // options.abstain_below: the top label's probability is below
};

struct InferenceResponse {
  std::string model;
  int64_t version = 0;
  // The manifest of the version that answered (its labels, tags and outputs), held with the version.
  std::shared_ptr<const Manifest> manifest;
  std::vector<TextResult> results;
  std::string request_id;
  // The threshold its answers were judged by (options.abstain_below, the request's or its model's default):
  // the metrics count its abstentions.
  std::optional<double> abstain_below;
  // For the access log and metrics: tokens fed to the model (after truncation), when its first text
  // joined the batch queue (the core's clock), the longest wait of its texts there, and the longest
  // batch it was in, whole and split into the forward pass and the post-processing of the rows.
  int64_t tokens = 0;
  absl::Time queued_at = absl::InfiniteFuture();
  absl::Duration queue_time;
  absl::Duration compute_time;
  absl::Duration forward_time;
  absl::Duration postprocess_time;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_OUTPUTS_ANSWER_H_

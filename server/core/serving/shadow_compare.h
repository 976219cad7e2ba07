// How a shadow candidate's answer to a text differs from the serving version's (docs/serving.md, "Shadow
// versions"): the comparisons ShadowMirror (shadow.h) aggregates into metrics and a summary, each a pure
// function of the two answers so that a test can check them against the same arithmetic done offline.
#ifndef QVI_SERVER_CORE_SERVING_SHADOW_COMPARE_H_
#define QVI_SERVER_CORE_SERVING_SHADOW_COMPARE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/core/outputs/answer.h"

namespace qvi {

// One text answered by both versions.
struct TextComparison {
  // Classifiers: each version's top label and the calibrated probability each gives the serving version's
  // top label (`score_difference` = candidate's − serving's). Taggers: "" and the spans below.
  std::string live_label, shadow_label;
  std::optional<double> score_difference;
  // Taggers: the spans each found and those both found alike (label and character offsets).
  int64_t live_spans = 0, shadow_spans = 0, same_spans = 0;
  // Spearman's rank correlation of the words' contributions to the serving version's top label (or, where
  // either answer has none, of α): how alike the two explain the text. Unset when it cannot be computed (no
  // per-word values, a different number of words, or one side constant).
  std::optional<double> rank_correlation;
  const char* explained_by = "";  // "contributions" or "attention" ("" with no rank correlation)
  bool agrees() const { return live_label == shadow_label && live_spans == same_spans && shadow_spans == same_spans; }
};

TextComparison CompareTexts(const TextResult& live, const TextResult& shadow);

// Spearman's ρ of two equally long series (ties take their mean rank); unset for fewer than two values,
// different lengths, or a constant series.
std::optional<double> SpearmanCorrelation(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_SHADOW_COMPARE_H_

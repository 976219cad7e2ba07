#include "server/core/serving/trust.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qvi {
namespace {

// A probability is compared with a threshold in double, with the float's rounding forgiven: 0.7F is
// 0.69999999, and a label the card's threshold 0.7 admits must not fall out for it.
constexpr double kFloatSlack = 1e-6;

// The card's level for `coverage` (levels are written to six places; a request names them as the card
// shows them).
const ConformalLevel* LevelOf(const CalibrationCard& card, double coverage) {
  for (const ConformalLevel& level : card.conformal) {
    if (std::abs(level.coverage_target - coverage) < 1e-9) return &level;
  }
  return nullptr;
}

std::string Levels(const CalibrationCard& card) {
  std::vector<std::string> levels;
  for (const ConformalLevel& level : card.conformal) levels.push_back(absl::StrCat(level.coverage_target));
  return levels.empty() ? "none" : absl::StrJoin(levels, ", ");
}

}  // namespace

absl::Status CheckTrustRanges(const OutputOptions& o) {
  if (o.coverage && !(*o.coverage > 0 && *o.coverage < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("options.coverage: ", *o.coverage, " is outside (0, 1)"));
  }
  if (o.abstain_below && !(*o.abstain_below >= 0 && *o.abstain_below <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("options.abstain_below: ", *o.abstain_below, " is outside [0, 1]"));
  }
  if (o.raw_scores && (o.coverage || o.abstain_below)) {
    return absl::InvalidArgumentError(absl::StrCat(o.coverage ? "options.coverage" : "options.abstain_below",
                                                   ": reads calibrated probabilities; not with options.raw_scores"));
  }
  return absl::OkStatus();
}

absl::Status CheckTrustOptions(Method method, const OutputOptions& o, const Manifest& m) {
  if (!o.coverage && !o.abstain_below) return absl::OkStatus();
  const char* field = o.coverage ? "options.coverage" : "options.abstain_below";
  if (o.coverage && method != Method::kClassify) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.coverage: label sets are for Classify; model '", m.name, "' tags"));
  }
  if (!m.calibration) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": model '", m.name, "' has no calibration on its card (`python -m qvi calibrate --write` adds one)"));
  }
  if (o.coverage && LevelOf(*m.calibration, *o.coverage) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("options.coverage: ", *o.coverage, " is not a level model '", m.name,
                                                   "' was calibrated for (", Levels(*m.calibration), ")"));
  }
  return absl::OkStatus();
}

void FillLabelTrust(const Manifest& m, const OutputOptions& o, const std::vector<float>& p, TextResult& result) {
  if (o.abstain_below && !p.empty()) {
    result.abstained = *std::max_element(p.begin(), p.end()) + kFloatSlack < *o.abstain_below;
  }
  if (!o.coverage || !m.calibration) return;
  const ConformalLevel* level = LevelOf(*m.calibration, *o.coverage);
  if (level == nullptr) return;  // CheckTrustOptions refused it
  LabelSetOutput set{*o.coverage, level->min_probability, {}};
  std::vector<size_t> order(std::min(p.size(), m.labels.size()));
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&p](size_t a, size_t b) { return p[a] > p[b]; });
  for (size_t i : order) {
    if (p[i] + kFloatSlack >= level->min_probability) set.labels.push_back(m.labels[i]);
  }
  result.label_set = std::move(set);
}

void FillSpanTrust(const OutputOptions& o, TextResult& result) {
  if (!o.abstain_below) return;
  for (SpanOutput& s : result.spans) s.abstained = s.score + kFloatSlack < *o.abstain_below;
}

}  // namespace qvi

// How far to trust a score (issue 77; docs/serving.md, "How far to trust a score"). A model whose card
// carries a calibration (model_store/qvi/calibration.py) answers probabilities at its temperature
// (Manifest::ScoreTemperature), and on request:
//   options.coverage       a classifier's label set: the labels whose calibrated probability is at least
//                          the card's split-conformal threshold for that coverage. On texts drawn like
//                          the dev split it was fitted on, the set holds the true label with at least
//                          that probability (on average over texts); it may be empty.
//   options.abstain_below  an answer (a classifier's top label; each entity) whose calibrated probability
//                          is below the threshold is marked abstained; it is still answered. A model's
//                          serving.json may set a default ("abstain_below"), which a request's own value
//                          (0: none abstains) or options.raw_scores overrides (request_checks.h's
//                          ApplyServingDefaults).
#ifndef QVI_SERVER_CORE_SERVING_TRUST_H_
#define QVI_SERVER_CORE_SERVING_TRUST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/core/manifest/manifest.h"
#include "server/core/outputs/answer.h"
#include "server/core/request/request.h"

namespace qvi {

// The options' ranges, before any model is resolved: INVALID_ARGUMENT naming the field.
absl::Status CheckTrustRanges(const OutputOptions& options);
// Against the model that answers: a coverage its card lists, for a classifier; a calibration on its
// card for either option (FAILED_PRECONDITION without one); neither with raw_scores.
absl::Status CheckTrustOptions(Method method, const OutputOptions& options, const Manifest& manifest);

// A classifier's label set and abstention from its calibrated probabilities (`probabilities[i]` is
// manifest.labels[i]'s), after CheckTrustOptions passed.
void FillLabelTrust(const Manifest& manifest, const OutputOptions& options, const std::vector<float>& probabilities,
                    TextResult& result);
// Each entity's abstention from its score.
void FillSpanTrust(const OutputOptions& options, TextResult& result);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_TRUST_H_

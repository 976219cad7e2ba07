// Drift gauges (docs/observability.md, "Drift"): for each model version whose card records a drift reference
// (Manifest::drift_reference, written by `python -m qvi drift-reference` over its test split), the last
// `window_texts` texts callers sent it, compared with that reference:
//   label        the mix of a classifier's top labels, of a tagger's entity types: population stability index
//   length       the tokens the model read of each text, in the reference's decile bins: PSI
//   unknown      the share of those tokens its vocabulary does not know (a sub-word model: of the words it reads,
//                those it does not hold whole), beside the reference's share
//   confidence   each answer's calibrated probability in the reference's bins (PSI), and the share below the
//                reference's threshold beside the reference's share; answers scored at another temperature
//                than the reference's (options.raw_scores) are left out of these two
// PSI = Σ (live − ref) · ln(live / ref) over the bins, each share floored at 1e-4. Only callers' requests are
// seen (a shadow mirror's are not: InferenceService wraps Submit alone), a text answered from the response
// cache included — it is traffic all the same; the server's own requests (redaction.h) are not. The work per
// answer, a pass over its texts' labels and scores and a few sums, is done before the answer is sent, so that a
// scrape after a caller's answer sees its texts. A version's window stays until the server stops (at most
// window_texts texts a version served).
#ifndef QVI_SERVER_CORE_SERVING_DRIFT_H_
#define QVI_SERVER_CORE_SERVING_DRIFT_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/core/base/sync.h"
#include "server/core/manifest/manifest.h"
#include "server/core/outputs/answer.h"
#include "server/core/runner/observer.h"

namespace qvi {

// A version's window compared with its reference, after the window's newest text.
struct DriftReading {
  int64_t texts = 0;    // in the window
  int64_t answers = 0;  // of their answers (a classifier's texts, a tagger's entities), those scored alike
  double label_psi = 0, length_psi = 0, confidence_psi = 0;
  double unknown = 0, unknown_reference = 0;  // shares of the vocabulary's units (tokens; a sub-word model's words)
  double below = 0, below_reference = 0, below_threshold = 0;
};

// PSI of `counts` (summing to `total` > 0) against `reference` shares; a bin past the reference's end is one the
// reference never saw (share 0).
double PopulationStability(const std::vector<int64_t>& counts, int64_t total, const std::vector<double>& reference);

class DriftMonitor {
 public:
  // `window_texts` > 0; `observer` (may be null) is told each reading.
  DriftMonitor(int window_texts, ServingObserver* observer);
  ~DriftMonitor();

  // One text of an answer, as the monitor keeps it.
  struct Text {
    uint32_t tokens = 0;                                                // read
    uint32_t units = 0, unknown = 0;                                    // TextResult::vocab_units, vocab_unknown
    std::vector<std::pair<std::string, std::optional<float>>> answers;  // label or type, and its score if scored
  };
  // What `answer` (OK, to a caller that asked raw_scores or not) tells of its texts; empty when its version
  // has no drift reference.
  static std::vector<Text> Read(const InferenceResponse& answer, bool raw_scores);
  // Adds `texts` (Read's, of an answer of `version`, whose manifest is `manifest`) to the version's window and
  // reports its reading. A version whose manifest changed (its files, in place) starts a new window.
  void Observe(const std::string& model, int64_t version, const std::shared_ptr<const Manifest>& manifest,
               const std::vector<Text>& texts);

  std::optional<DriftReading> Reading(const std::string& model, int64_t version) const;

 private:
  struct Window;
  const size_t window_;
  ServingObserver* const observer_;
  mutable Mutex mu_;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<Window>> windows_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_DRIFT_H_

// Drift gauges (server/core/serving/drift.h; docs/observability.md, "Drift"): per model and version, its window of
// callers' texts against the reference its card records — the population stability index of the label mix, the
// texts' lengths and the answers' calibrated confidence, the share of unknown tokens and the share of answers
// below the reference's confidence threshold (each beside the reference's own), and how many texts and scored
// answers the window holds (an alert waits for enough of them).
#include <prometheus/gauge.h>

#include "absl/strings/str_cat.h"
#include "server/core/serving/drift.h"
#include "server/metrics/metrics.h"

namespace qvi {

Metrics::Drift::Drift(prometheus::Registry& registry)
    : psi(prometheus::BuildGauge()
              .Name("qvi_drift_psi")
              .Help("Population stability index of a version's last --drift-window-texts callers' texts against "
                    "the test split its card records, by feature: label (the mix of top labels; a tagger's entity "
                    "types), length (tokens read per text), confidence (calibrated probability of each answer). "
                    "Below 0.1: nothing moved; 0.1-0.25: something did; above 0.25: not the split's traffic")
              .Register(registry)),
      unknown(prometheus::BuildGauge()
                  .Name("qvi_drift_unknown_share")
                  .Help("Share of the tokens read that the model's vocabulary does not know ([UNK]; a sub-word model: "
                        "of the words read, those it does not hold whole), in the window (side=live) and on the "
                        "card's test split (side=reference)")
                  .Register(registry)),
      below(prometheus::BuildGauge()
                .Name("qvi_drift_low_confidence_share")
                .Help("Share of answers (a classifier's texts, a tagger's entities) whose calibrated probability is "
                      "below the card's threshold (label threshold), in the window (side=live) and on the card's "
                      "test split (side=reference)")
                .Register(registry)),
      texts(prometheus::BuildGauge()
                .Name("qvi_drift_window")
                .Help("What the drift window holds: texts, and answers scored at the card's temperature (what=answers)")
                .Register(registry)) {}

void Metrics::OnDrift(const std::string& model, int64_t version, const DriftReading& r) {
  Drift::Series s;
  {
    MutexLock lock(&mu_);
    auto [it, added] = drift_series_.try_emplace({model, version});
    if (added) {
      const prometheus::Labels v{{"model", model}, {"version", absl::StrCat(version)}};
      auto with = [&v](std::initializer_list<std::pair<const std::string, std::string>> more) {
        prometheus::Labels l = v;
        l.insert(more);
        return l;
      };
      const std::string threshold = absl::StrCat(r.below_threshold);
      it->second = {&drift_.psi.Add(with({{"feature", "label"}})),
                    &drift_.psi.Add(with({{"feature", "length"}})),
                    &drift_.psi.Add(with({{"feature", "confidence"}})),
                    &drift_.unknown.Add(with({{"side", "live"}})),
                    &drift_.unknown.Add(with({{"side", "reference"}})),
                    &drift_.below.Add(with({{"side", "live"}, {"threshold", threshold}})),
                    &drift_.below.Add(with({{"side", "reference"}, {"threshold", threshold}})),
                    &drift_.texts.Add(with({{"what", "texts"}})),
                    &drift_.texts.Add(with({{"what", "answers"}}))};
    }
    s = it->second;
  }
  s.label->Set(r.label_psi);
  s.length->Set(r.length_psi);
  s.confidence->Set(r.confidence_psi);
  s.unknown->Set(r.unknown);
  s.unknown_reference->Set(r.unknown_reference);
  s.below->Set(r.below);
  s.below_reference->Set(r.below_reference);
  s.texts->Set(static_cast<double>(r.texts));
  s.answers->Set(static_cast<double>(r.answers));
}

}  // namespace qvi

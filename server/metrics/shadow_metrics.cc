// Metrics of shadow versions (server/core/serving/shadow.h; docs/observability.md, "Shadow versions"): per
// model, serving version (`live_version`) and candidate (`shadow_version`), the texts compared and agreed on,
// the label flips by pair, the spans each found (F1 = 2·both / (live + shadow)), the texts dropped by reason,
// and histograms of the rank correlation of the words' explanations, the calibrated score difference and the
// compute time difference. Label values come from the store (names, versions, the models' own labels).
#include <prometheus/counter.h>
#include <prometheus/histogram.h>

#include "absl/strings/str_cat.h"
#include "server/core/serving/shadow_compare.h"
#include "server/metrics/metrics.h"

namespace qvi {
namespace {

prometheus::Labels PairLabels(const std::string& model, int64_t live, int64_t shadow) {
  return {{"model", model}, {"live_version", absl::StrCat(live)}, {"shadow_version", absl::StrCat(shadow)}};
}

prometheus::Labels With(prometheus::Labels labels, const std::string& key, const std::string& value) {
  labels[key] = value;
  return labels;
}

}  // namespace

Metrics::Shadow::Shadow(prometheus::Registry& registry)
    : compared(prometheus::BuildCounter()
                   .Name("qvi_shadow_compared_texts_total")
                   .Help("Texts mirrored to a shadow candidate and answered by it and the serving version")
                   .Register(registry)),
      agreed(prometheus::BuildCounter()
                 .Name("qvi_shadow_agreed_texts_total")
                 .Help("Compared texts both versions gave the same label (taggers: the same spans)")
                 .Register(registry)),
      flips(prometheus::BuildCounter()
                .Name("qvi_shadow_label_flips_total")
                .Help("Compared texts whose top label differs, by the serving version's label (from) and the "
                      "candidate's (to)")
                .Register(registry)),
      spans(prometheus::BuildCounter()
                .Name("qvi_shadow_spans_total")
                .Help("Taggers' spans in compared texts: found by the serving version (live), the candidate "
                      "(shadow), or both alike (both); span F1 = 2 both / (live + shadow)")
                .Register(registry)),
      dropped(prometheus::BuildCounter()
                  .Name("qvi_shadow_dropped_texts_total")
                  .Help("Mirrored texts dropped before their comparison: cpu (the process's CPU busier than "
                        "--shadow-max-cpu-busy), busy (over --shadow-max-inflight-texts or a full request queue), "
                        "shed (the batch queue made room for callers), failed")
                  .Register(registry)),
      rank_correlation(prometheus::BuildHistogram()
                           .Name("qvi_shadow_rank_correlation")
                           .Help("Per compared text, Spearman's rank correlation of the words' contributions "
                                 "(explained_by=contributions) or α (attention) between the two versions")
                           .Register(registry)),
      score_difference(prometheus::BuildHistogram()
                           .Name("qvi_shadow_score_difference")
                           .Help("Per compared text, the candidate's calibrated probability of the serving "
                                 "version's top label less the serving version's")
                           .Register(registry)),
      latency_difference(prometheus::BuildHistogram()
                             .Name("qvi_shadow_latency_difference_seconds")
                             .Help("Per mirrored request, the candidate's compute time less the serving "
                                   "version's (both run alike, at the lowest priority)")
                             .Register(registry)) {}

void Metrics::OnShadowCompared(const std::string& model, int64_t live, int64_t shadow, const TextComparison& c) {
  const prometheus::Labels pair = PairLabels(model, live, shadow);
  shadow_.compared.Add(pair).Increment();
  if (c.agrees()) shadow_.agreed.Add(pair).Increment();
  if (c.live_label != c.shadow_label) {
    shadow_.flips.Add(With(With(pair, "from", c.live_label), "to", c.shadow_label)).Increment();
  }
  if (c.live_spans + c.shadow_spans > 0) {
    shadow_.spans.Add(With(pair, "side", "live")).Increment(static_cast<double>(c.live_spans));
    shadow_.spans.Add(With(pair, "side", "shadow")).Increment(static_cast<double>(c.shadow_spans));
    shadow_.spans.Add(With(pair, "side", "both")).Increment(static_cast<double>(c.same_spans));
  }
  if (c.rank_correlation) {
    shadow_.rank_correlation
        .Add(With(pair, "explained_by", c.explained_by),
             prometheus::Histogram::BucketBoundaries{-0.5, 0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1})
        .Observe(*c.rank_correlation);
  }
  if (c.score_difference) {
    shadow_.score_difference
        .Add(pair, prometheus::Histogram::BucketBoundaries{-0.5, -0.2, -0.1, -0.05, -0.01, 0.01, 0.05, 0.1, 0.2, 0.5})
        .Observe(*c.score_difference);
  }
}

void Metrics::OnShadowLatency(const std::string& model, int64_t live, int64_t shadow, absl::Duration difference) {
  shadow_.latency_difference
      .Add(PairLabels(model, live, shadow),
           prometheus::Histogram::BucketBoundaries{-0.1, -0.01, -0.001, -0.0001, 0.0001, 0.001, 0.01, 0.1})
      .Observe(absl::ToDoubleSeconds(difference));
}

void Metrics::OnShadowDropped(const std::string& model, int64_t live, int64_t shadow, const char* reason,
                              int64_t texts) {
  shadow_.dropped.Add(With(PairLabels(model, live, shadow), "reason", reason)).Increment(static_cast<double>(texts));
}

}  // namespace qvi

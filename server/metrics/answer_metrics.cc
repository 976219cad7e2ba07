// What the answers are made of: tokens run through the models, and each answer's bytes and the time
// to make it, by the explanations it asked for (issue: "metrics people look for"); the response
// cache's counts; the spans exported.
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include "server/metrics/buckets.h"
#include "server/metrics/metrics.h"

namespace qvi {

Metrics::AnswerMix::AnswerMix(prometheus::Registry& registry)
    : tokens(prometheus::BuildCounter()
                 .Name("qvi_tokens_total")
                 .Help("Tokens run through each model version: the real tokens of its batches (no padding; "
                       "the leave-one-out rows of options.occlusion count, as the model runs them)")
                 .Register(registry)),
      bytes(prometheus::BuildHistogram()
                .Name("qvi_answer_size_bytes")
                .Help("Each answered inference call's answer as serialised, by model and the explanations asked "
                      "for (explain: none, or kinds joined by '+': tokens, attention, gates, layer_gates, "
                      "layer_attention, contributions, occlusion, faithfulness)")
                .Register(registry)),
      seconds(prometheus::BuildHistogram()
                  .Name("qvi_answer_make_seconds")
                  .Help("Time to make each answered call's answer (post-processing its texts' rows and "
                        "serialising), by model and the explanations asked for")
                  .Register(registry)),
      cache_hits(prometheus::BuildCounter()
                     .Name("qvi_response_cache_hits_total")
                     .Help("Texts answered from the response cache (--response-cache-bytes), by model")
                     .Register(registry)),
      cache_misses(prometheus::BuildCounter()
                       .Name("qvi_response_cache_misses_total")
                       .Help("Texts the response cache did not hold, sent to the model, by model")
                       .Register(registry)),
      cache_evictions(prometheus::BuildCounter()
                          .Name("qvi_response_cache_evictions_total")
                          .Help("Answers let go from the response cache to make room, least recently used first")
                          .Register(registry)),
      cache_bytes(prometheus::BuildGauge()
                      .Name("qvi_response_cache_bytes")
                      .Help("Bytes of answers the response cache holds (an estimate of their memory)")
                      .Register(registry)
                      .Add({})),
      spans(prometheus::BuildCounter()
                .Name("qvi_otlp_spans_total")
                .Help("Spans of exported traces (--otlp-endpoint), by outcome: exported (the collector took them), "
                      "dropped (the exporter's queue was full), failed (the collector was down, slow or refused)")
                .Register(registry)),
      judged(prometheus::BuildCounter()
                 .Name("qvi_abstention_judged_total")
                 .Help("Answers judged by an abstention threshold (options.abstain_below, or the model's serving.json "
                       "default; a classifier's text, a tagger's entity), by model and version: qvi_abstained_total "
                       "over it is the share abstained")
                 .Register(registry)),
      abstained(prometheus::BuildCounter()
                    .Name("qvi_abstained_total")
                    .Help("Answers marked abstained: their calibrated probability was below the threshold. "
                          "A share that climbs says live traffic no longer looks like the split the model was "
                          "calibrated on")
                    .Register(registry)) {}

void Metrics::OnLookups(const std::string& model, int hits, int misses) {
  if (hits > 0) answer_mix_.cache_hits.Add({{"model", model}}).Increment(hits);
  if (misses > 0) answer_mix_.cache_misses.Add({{"model", model}}).Increment(misses);
}

void Metrics::OnSize(int64_t bytes) { answer_mix_.cache_bytes.Set(static_cast<double>(bytes)); }

void Metrics::OnEvictions(const std::string& model, int evicted) {
  answer_mix_.cache_evictions.Add({{"model", model}}).Increment(evicted);
}

void Metrics::OnSpans(const char* outcome, int64_t spans) {
  answer_mix_.spans.Add({{"outcome", outcome}}).Increment(static_cast<double>(spans));
}

void Metrics::OnAnswer(const std::string& model, const std::string& explain, int64_t bytes, absl::Duration made) {
  std::pair<prometheus::Histogram*, prometheus::Histogram*> series;
  {
    MutexLock lock(&mu_);
    auto& s = answers_[{model, explain}];
    if (s.first == nullptr) {
      const prometheus::Labels labels{{"model", model}, {"explain", explain}};
      s = {&answer_mix_.bytes.Add(labels, PowersOfTwo(256, 1 << 26)),
           &answer_mix_.seconds.Add(labels, LatencyBuckets())};
    }
    series = s;
  }
  series.first->Observe(static_cast<double>(bytes));
  series.second->Observe(absl::ToDoubleSeconds(made));
}

void Metrics::OnAbstention(const std::string& model, int64_t version, int64_t judged, int64_t abstained) {
  const prometheus::Labels labels{{"model", model}, {"version", std::to_string(version)}};
  answer_mix_.judged.Add(labels).Increment(static_cast<double>(judged));
  answer_mix_.abstained.Add(labels).Increment(static_cast<double>(abstained));
}

}  // namespace qvi

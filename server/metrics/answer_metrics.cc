// What the answers are made of: tokens run through the models, and each answer's bytes and the time
// to make it, by the explanations it asked for (issue: "metrics people look for").
#include <prometheus/counter.h>
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
                  .Register(registry)) {}

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

}  // namespace qvi

// Shadow versions (docs/serving.md, "Shadow versions"): a model's serving.json names a candidate version and
// a fraction of live texts to mirror to it (ShadowSettings). After the serving version has answered a request
// that named no version, a sample of its texts is run again, off the caller's path, on both the serving
// version and the candidate — the same outputs asked of each (every label, the words with their
// contributions or α), at the lowest priority — and the two answers are compared text by text
// (shadow_compare.h). Running the serving version again, rather than reusing the caller's answer, makes the
// two answers alike in what they carry and the two latencies alike in how they were queued; the caller's own
// answer is never touched, nor waited for.
//
// Shed first: a sample taken while the process's CPU is busier than --shadow-max-cpu-busy is dropped whole
// ("cpu": on a busy core a mirrored batch, which cannot be pre-empted, delays the callers' texts that arrive
// while it runs; Options::idle, a CpuHeadroom), at most Options::max_inflight_texts mirrored texts are in the
// core at once, a mirror that would pass that is dropped whole ("busy"), a request thread queue that is full
// drops it too ("busy"), and the batch queue sheds low-priority texts before any other ("shed"); a mirrored
// answer that fails is "failed". Every drop is counted (ServingObserver::OnShadowDropped) and summed in the
// summary; no mirrored answer is sent to anyone.
#ifndef QVI_SERVER_CORE_SERVING_SHADOW_H_
#define QVI_SERVER_CORE_SERVING_SHADOW_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/base/sync.h"
#include "server/core/outputs/answer.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request.h"
#include "server/core/runner/observer.h"
#include "server/core/serving/redaction.h"
#include "server/core/serving/shadow_compare.h"

namespace qvi {

// The comparison of one serving version with its candidate, so far.
struct ShadowSummary {
  std::string model;
  int64_t live_version = 0, shadow_version = 0;
  double fraction = 0;
  bool keep_texts = false;
  int64_t mirrored = 0;                    // texts sampled for mirroring
  int64_t compared = 0;                    // texts both versions answered, compared
  std::map<std::string, int64_t> dropped;  // by reason: cpu, busy, shed, failed
  int64_t agreements = 0;                  // compared texts with the same label (taggers: the same spans)
  std::map<std::pair<std::string, std::string>, int64_t> flips;  // (serving's label, candidate's) -> texts
  int64_t live_spans = 0, shadow_spans = 0, same_spans = 0;      // taggers
  double rank_correlation_sum = 0;
  int64_t rank_correlations = 0;
  double score_difference_sum = 0, abs_score_difference_sum = 0;
  int64_t score_differences = 0;
  double latency_difference_ms_sum = 0;  // candidate's compute time − the serving version's, per mirrored request
  int64_t latencies = 0;
  struct Disagreement {
    std::string text;         // with keep_texts (masked with a redactor); else ""
    std::string text_sha256;  // hex, always
    TextComparison comparison;
    double severity = 0;  // what orders them: a flipped label or a missed span first, then the least alike
  };
  std::vector<Disagreement> disagreements;  // the most severe first, at most Options::keep_disagreements

  // The derived figures (0 when nothing was compared).
  double label_agreement() const;
  std::optional<double> span_f1() const;  // taggers
  std::optional<double> mean_rank_correlation() const;
  std::optional<double> mean_score_difference() const;
  std::optional<double> mean_latency_difference_ms() const;
};

class ShadowMirror {
 public:
  struct Options {
    int max_inflight_texts = 64;                 // --shadow-max-inflight-texts
    absl::Duration timeout = absl::Seconds(30);  // each mirrored request's deadline
    int keep_disagreements = 10;
    uint64_t seed = 0x5eed;  // the sampling's
    // Whether there is idle CPU for a sample at `now` (CpuHeadroom::Idle); null: always.
    std::function<bool(absl::Time now)> idle;
  };
  using Done = std::function<void(absl::StatusOr<InferenceResponse>)>;
  // Runs a mirrored request in the core (off the caller's thread); false: it could not be queued.
  using Dispatch = std::function<bool(Method method, InferenceRequest request, Done done)>;

  // `repository` gives the models' shadow settings and manifests; `observer` (may be null) counts.
  ShadowMirror(const ModelRepository* repository, ServingObserver* observer, Options options);

  // Whether a request for `model` that names `version` may be mirrored: it names none and the model has a
  // candidate. Cheap; the caller keeps the request's texts only then.
  std::optional<ShadowSettings> Wants(const std::string& model, int64_t version) const;

  // The serving version answered `texts` with `live` (OK): samples the texts and mirrors them. Returns at
  // once; `dispatch` runs the two mirrored requests. `now` is the core's clock (the deadlines').
  void Mirror(Method method, const ShadowSettings& settings, const std::vector<std::string>& texts,
              const InferenceResponse& live, absl::Time now, const Dispatch& dispatch);

  // Every comparison of `model` so far (one per serving version and candidate pair), the newest pair first.
  std::vector<ShadowSummary> Summaries(const std::string& model) const;

  // The texts a summary keeps (keep_texts) are masked first (redaction.h); one that cannot be is not kept (its
  // SHA-256 alone). Set before the first Mirror.
  void SetRedactor(TextRedactor redactor) { redactor_ = std::move(redactor); }

  // Mirrors nothing more (the server is draining); what is in flight finishes.
  void Stop() { stopped_.store(true); }

 private:
  struct Pair;  // the two mirrored answers of one sample, joined
  using Key = std::tuple<std::string, int64_t, int64_t>;

  // Samples `texts` into `pair`, counts them in its summary and, if they may run, in flight: nullptr, or the
  // reason they are dropped unrun ("cpu", "busy").
  const char* Sample(const ShadowSettings& settings, const std::vector<std::string>& texts,
                     const InferenceResponse& live, absl::Time now, Pair& pair);
  void Compared(const Key& key, const std::vector<std::string>& texts, const InferenceResponse& live,
                const InferenceResponse& shadow);
  // Keeps `text`'s disagreement in the summary if it is among the most severe; true when its text is to be masked
  // (keep_texts with a redactor) before it is shown.
  bool Keep(const TextComparison& c, const std::string& text, ShadowSummary& s) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Dropped(const Key& key, const char* reason, int64_t texts);
  void Release(int64_t texts);

  const ModelRepository* const repository_;
  ServingObserver* const observer_;
  const Options options_;
  TextRedactor redactor_;
  // A kept text, masked: into its disagreement, if it is still kept.
  void Masked(const Key& key, const std::string& sha256, const absl::StatusOr<std::vector<RedactedText>>& masked);
  std::atomic<bool> stopped_{false};
  mutable Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  int64_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<Key, ShadowSummary> summaries_ ABSL_GUARDED_BY(mu_);
  std::map<Key, int64_t> order_ ABSL_GUARDED_BY(mu_);  // when each pair was first seen
  int64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
};

// The hex SHA-256 of `text` (how a summary and the decision log name a text they do not keep).
std::string TextSha256(const std::string& text);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_SHADOW_H_

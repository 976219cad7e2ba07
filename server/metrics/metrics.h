// The server's Prometheus metrics (prometheus-cpp), served as text exposition on their own port.
//
// Names follow Prometheus conventions: base units (seconds), `_total` for counters, a `qvi_`
// prefix. Latency histograms have 1-2-5 buckets from 100 µs to 10 s, so both sub-millisecond
// queue waits and multi-second batches resolve. Every series carries `model` and, where one
// version is concerned, `version`.
//
// Label values come from the store, never from clients: a request for a model the server does not
// have is counted under model="_unknown", so a client cannot grow the number of series.
#ifndef QVI_SERVER_METRICS_METRICS_H_
#define QVI_SERVER_METRICS_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/base/sync.h"
#include "server/core/repository/model_repository.h"
#include "server/core/runner/observer.h"
#include "server/core/serving/response_cache.h"

namespace httplib {
class Server;
}

namespace qvi {

class Metrics final : public ServingObserver, public ResponseCache::Events {
 public:
  // Metrics kept in a registry only (tests read them with Serialize()).
  Metrics();
  // The same, served at http://<host>:<port>/metrics; port 0 picks a free port (see port()).
  static absl::StatusOr<std::unique_ptr<Metrics>> Serve(const std::string& host, int port);
  ~Metrics() override;

  int port() const { return port_; }
  // The registry in Prometheus text format, as a scrape would see it.
  std::string Serialize() const;

  // A Classify/Tag call: counted in flight from its start to its answer.
  void OnRequestStart();
  // `model` is the name to label it with (already "_unknown" for models not in the store),
  // `version` the version that served it (0 when none did), `code` the gRPC status code name.
  void OnRequestDone(const std::string& method, const std::string& model, int64_t version, const std::string& code,
                     absl::Duration latency);

  // A call of a server with --api-keys, by the key's name (names come from the key file only:
  // a bounded set) and the gRPC status code name.
  void OnKeyRequest(const std::string& key, const std::string& code);
  // A call refused for a key's rate limit: "requests", "texts" or "tokens".
  void OnKeyLimited(const std::string& key, const std::string& limit);

  // ServingObserver: from the model instance threads.
  void OnBatch(const std::string& model, int64_t version, const BatchReport& batch) override;
  void OnQueueDepth(const std::string& model, int64_t version, size_t texts) override;
  // From the answer threads (or an instance thread that answers its own batch).
  void OnAnswers(const std::string& model, int64_t version, const AnswerReport& answers) override;
  // From the thread that enqueued the request that took their place.
  void OnShed(const std::string& model, int64_t version, int level, size_t texts) override;
  // Shadow versions (shadow_metrics.cc): per model, serving version and candidate.
  void OnShadowCompared(const std::string& model, int64_t live, int64_t shadow,
                        const TextComparison& comparison) override;
  void OnShadowLatency(const std::string& model, int64_t live, int64_t shadow, absl::Duration difference) override;
  void OnShadowDropped(const std::string& model, int64_t live, int64_t shadow, const char* reason,
                       int64_t texts) override;
  // Drift gauges (drift_metrics.cc): per model and version.
  void OnDrift(const std::string& model, int64_t version, const DriftReading& reading) override;

  // A counter read at each scrape from `read` (for counts kept elsewhere, such as the access log's
  // dropped lines). Call before the first scrape.
  void AddScrapedCounter(const std::string& name, const std::string& help, std::function<double()> read);
  // The same for a gauge (a value that goes up and down, such as a certificate's expiry time).
  void AddScrapedGauge(const std::string& name, const std::string& help, std::function<double()> read);

  // The repository's events: qvi_model_state{model,version,state} is 1 for a version's current
  // state; an unloaded version's series are removed.
  void OnModelEvent(const std::string& model, const VersionStatus& status);
  // A READY version's model files changed in place: qvi_model_file_changes_total{model,result}, the
  // result "reloaded" (the new files serve) or "failed" (the files loaded before still serve).
  void OnModelFilesChanged(const std::string& model, bool reloaded);
  // One answered inference call: its answer's bytes as serialised and the time it took to make them
  // (post-processing and serialising), by model and the explanations asked for (ExplainLabel).
  void OnAnswer(const std::string& model, const std::string& explain, int64_t bytes, absl::Duration made);
  // An answer judged by an abstention threshold (options.abstain_below, or its model's serving.json default):
  // `judged` answers (texts, or entities), `abstained` of them marked (qvi_abstention_judged_total,
  // qvi_abstained_total).
  void OnAbstention(const std::string& model, int64_t version, int64_t judged, int64_t abstained);
  // ResponseCache::Events: qvi_response_cache_{hits,misses,evictions}_total{model}.
  void OnLookups(const std::string& model, int hits, int misses) override;
  void OnEvictions(const std::string& model, int evicted) override;
  void OnSize(int64_t bytes) override;  // qvi_response_cache_bytes
  // Spans the OTLP exporter exported, dropped (its queue was full) or failed to send:
  // qvi_otlp_spans_total{outcome}.
  void OnSpans(const char* outcome, int64_t spans);
  // A model loaded (reason: poll, admin, demand) or unloaded to save memory (budget, idle):
  // qvi_model_loads_total / qvi_model_evictions_total{model,reason}.
  void OnModelMemoryEvent(const std::string& model, bool loaded, const char* reason);

 private:
  struct VersionSeries {
    prometheus::Histogram* queue = nullptr;
    prometheus::Histogram* compute = nullptr;
    prometheus::Histogram* answer_wait = nullptr;
    prometheus::Histogram* answer = nullptr;
    prometheus::Histogram* batch_size = nullptr;
    prometheus::Histogram* batch_tokens = nullptr;
    prometheus::Histogram* padding = nullptr;
    prometheus::Counter* batch_failures = nullptr;
    prometheus::Counter* device_busy = nullptr;
    prometheus::Gauge* queue_texts = nullptr;
    prometheus::Counter* tokens = nullptr;
  };
  VersionSeries& SeriesFor(const std::string& model, int64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // qvi_model_memory_bytes{model,version,device} while the version is READY or UNLOADING.
  void SetModelMemory(const std::string& model, const VersionStatus& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  int port_ = 0;

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_seconds_;
  prometheus::Gauge& in_flight_;
  prometheus::Family<prometheus::Histogram>& queue_seconds_;
  prometheus::Family<prometheus::Histogram>& compute_seconds_;
  prometheus::Family<prometheus::Histogram>& answer_wait_seconds_;
  prometheus::Family<prometheus::Histogram>& answer_seconds_;
  prometheus::Family<prometheus::Histogram>& batch_size_;
  prometheus::Family<prometheus::Histogram>& batch_tokens_;
  prometheus::Family<prometheus::Histogram>& padding_ratio_;
  prometheus::Family<prometheus::Counter>& batch_failures_;
  prometheus::Family<prometheus::Counter>& device_busy_;
  prometheus::Family<prometheus::Gauge>& queue_texts_;
  prometheus::Family<prometheus::Gauge>& model_state_;
  prometheus::Family<prometheus::Gauge>& model_info_;
  prometheus::Family<prometheus::Counter>& file_changes_;
  prometheus::Family<prometheus::Counter>& shed_;
  prometheus::Family<prometheus::Counter>& key_requests_;
  prometheus::Family<prometheus::Counter>& key_limited_;
  // The models' memory (model_metrics.cc): footprints, loads and evictions.
  struct ModelMemory {
    explicit ModelMemory(prometheus::Registry& registry);
    prometheus::Family<prometheus::Gauge>& bytes;
    prometheus::Family<prometheus::Counter>& loads;
    prometheus::Family<prometheus::Counter>& evictions;
  };
  ModelMemory model_memory_;
  // What the answers are made of (answer_metrics.cc): tokens, and each answer's bytes and making time.
  struct AnswerMix {
    explicit AnswerMix(prometheus::Registry& registry);
    prometheus::Family<prometheus::Counter>& tokens;
    prometheus::Family<prometheus::Histogram>& bytes;
    prometheus::Family<prometheus::Histogram>& seconds;
    prometheus::Family<prometheus::Counter>& cache_hits;
    prometheus::Family<prometheus::Counter>& cache_misses;
    prometheus::Family<prometheus::Counter>& cache_evictions;
    prometheus::Gauge& cache_bytes;
    prometheus::Family<prometheus::Counter>& spans;
    prometheus::Family<prometheus::Counter>& judged;
    prometheus::Family<prometheus::Counter>& abstained;
  };
  AnswerMix answer_mix_;
  // Shadow versions' comparisons (shadow_metrics.cc).
  struct Shadow {
    explicit Shadow(prometheus::Registry& registry);
    prometheus::Family<prometheus::Counter>& compared;
    prometheus::Family<prometheus::Counter>& agreed;
    prometheus::Family<prometheus::Counter>& flips;
    prometheus::Family<prometheus::Counter>& spans;
    prometheus::Family<prometheus::Counter>& dropped;
    prometheus::Family<prometheus::Histogram>& rank_correlation;
    prometheus::Family<prometheus::Histogram>& score_difference;
    prometheus::Family<prometheus::Histogram>& latency_difference;
  };
  Shadow shadow_{*registry_};  // registry_ is declared (so made) before
  // Drift gauges (drift_metrics.cc).
  struct Drift {
    explicit Drift(prometheus::Registry& registry);
    prometheus::Family<prometheus::Gauge>& psi;
    prometheus::Family<prometheus::Gauge>& unknown;
    prometheus::Family<prometheus::Gauge>& below;
    prometheus::Family<prometheus::Gauge>& texts;
    // One version's series: the three PSIs, the live and reference shares, the window's texts and answers.
    struct Series {
      prometheus::Gauge *label, *length, *confidence, *unknown, *unknown_reference, *below, *below_reference, *texts,
          *answers;
    };
  };
  Drift drift_{*registry_};

  struct ScrapedCounter {
    std::string name, help;
    std::function<double()> read;
    bool gauge = false;
  };

  mutable Mutex mu_;
  std::vector<ScrapedCounter> scraped_ ABSL_GUARDED_BY(mu_);
  // Series looked up per event; prometheus-cpp's Family::Add would do the same under its own lock,
  // but this map also lets an unloaded version's series be removed.
  std::map<std::pair<std::string, int64_t>, VersionSeries> versions_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, std::string, int64_t, std::string>, prometheus::Counter*> request_counters_
      ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, std::string, int64_t>, prometheus::Histogram*> request_latency_ ABSL_GUARDED_BY(mu_);
  // The API keys' series, by (key, code) and (key, limit).
  using KeySeries = std::map<std::pair<std::string, std::string>, prometheus::Counter*>;
  KeySeries key_counters_ ABSL_GUARDED_BY(mu_);
  KeySeries key_limited_counters_ ABSL_GUARDED_BY(mu_);
  // Counts one event of `key`: in qvi_key_limited_total{limit=value} when `limited`, else in
  // qvi_key_requests_total{code=value}.
  void CountKey(bool limited, const std::string& key, const std::string& value) ABSL_LOCKS_EXCLUDED(mu_);
  std::map<std::pair<std::string, int64_t>, std::pair<prometheus::Gauge*, prometheus::Gauge*>> state_
      ABSL_GUARDED_BY(mu_);  // (state gauge, info gauge)
  std::map<std::pair<std::string, int64_t>, prometheus::Gauge*> memory_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int64_t>, Drift::Series> drift_series_ ABSL_GUARDED_BY(mu_);
  // AnswerMix's histograms by (model, explain): (bytes, seconds).
  std::map<std::pair<std::string, std::string>, std::pair<prometheus::Histogram*, prometheus::Histogram*>> answers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace qvi

#endif  // QVI_SERVER_METRICS_METRICS_H_

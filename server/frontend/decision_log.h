// The decision log (docs/observability.md, "The decision log"): for audit and drift, a sampled record of what
// the server decided — one JSON line per sampled Classify or Tag call, whatever its protocol:
//   {"time": "2026-12-07T12:00:00.123Z", "model": "sentiment", "version": 1, "artifact_sha256": "…",
//    "key": "team-a", "request_id": "…", "trace_id": "…", "latency_ms": 3.1,
//    "texts": [{"sha256": "…", "text": "…" (--decision-log-texts only), "labels": [{"label", "score"}, …] |
//               "spans": [{"type", "start", "end", "score"}, …], "abstained": false,
//               "top_words": [{"word", "contribution" | "alpha"}, …]}]}
// The scores are the calibrated ones the caller got; top_words are the words that contributed most to the top
// label (or, with no contributions in the answer, those with the most α), when the answer carries them.
// Sampled per call at --decision-log-rate, or a model's or a key's own rate (--decision-log-model-rate M=R,
// --decision-log-key-rate K=R; a key's wins). Written by a thread of its own from a bounded queue: a call never
// waits for the disk, and a line that finds the queue full is dropped and counted. The file is rotated once it
// would pass --decision-log-max-bytes (PATH.1 the newest of the --decision-log-keep older files); a line is
// never split across files. `artifact_sha256` is the SHA-256 of the version's artifact file as it is on disk when
// the call is answered (its path and time stamp taken then; hashed by the writer, once per file and stamp).
// Other destinations (OTLP logs, --decision-log-otlp-endpoint) take each line from the writer too (SetSink); the
// file is then optional. With --decision-log-texts and a redactor (SetRedactor: --redact-texts-with, the
// server's own tagger), each text is written with the entities of the chosen types masked ("[PER] flew to
// [LOC]"); a text that could not be redacted is written as null, never as it was, and the line says why
// ("redaction_error"). The top words are the texts' own words: with a redactor, one inside a masked entity is masked
// as it is ("[PER]"), whether the texts are written or not, and a line whose redaction failed has none.
#ifndef QVI_SERVER_FRONTEND_DECISION_LOG_H_
#define QVI_SERVER_FRONTEND_DECISION_LOG_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json_fwd.hpp"
#include "server/core/base/sync.h"
#include "server/core/outputs/answer.h"
#include "server/core/repository/model_repository.h"
#include "server/core/serving/redaction.h"

namespace qvi {

class DecisionLog : public std::enable_shared_from_this<DecisionLog> {
 public:
  struct Options {
    std::string path;  // empty: no file (a sink alone)
    double rate = 1.0;
    std::map<std::string, double> model_rates, key_rates;
    int64_t max_bytes = int64_t{64} << 20;
    int keep = 5;
    bool texts = false;
    int queue_lines = 4096;
    int top_words = 5;
    uint64_t seed = 0x5eed;
  };
  // Opens (appends to) `options.path`; the error names the path. The repository (which answers what a version's
  // artifact is) is set before the first call is offered.
  static absl::StatusOr<std::shared_ptr<DecisionLog>> Open(Options options);
  void SetRepository(const ModelRepository* repository) { repository_.store(repository); }

  // Another destination for each line (OTLP logs): called from the writer thread, after the file.
  struct Written {
    const std::string& line;  // without its newline
    absl::Time time;
    const std::string& trace_id;  // hex; empty without one
    const std::string& model;
    int64_t version;
    const std::string& request_id;
  };
  using Sink = std::function<void(const Written& written)>;
  // Both set before the first call is offered. The redactor masks a call's texts before its line is written
  // (Options::texts; serving/redaction.h), called on the answering thread.
  void SetSink(Sink sink) { sink_ = std::move(sink); }
  void SetRedactor(std::string model, TextRedactor redactor) {
    redact_with_ = std::move(model);
    redactor_ = std::move(redactor);
  }
  ~DecisionLog();  // writes what is queued, then stops

  const Options& options() const { return options_; }
  // Whether a sampled call's texts are kept for its line: written (Options::texts), or redacted to mask its top
  // words (a redactor).
  bool keeps_texts() const { return options_.texts || redactor_ != nullptr; }
  // Whether a call for `model` by `key` ("" without keys) is logged.
  bool Sample(const std::string& model, const std::string& key);

  // One sampled call, answered: its line is made here (the caller's thread) and queued.
  struct Call {
    const InferenceResponse* answer = nullptr;
    std::vector<std::string> text_sha256, texts;  // per text; `texts` only with Options::texts
    std::string key, request_id, trace_id;
    absl::Time time;
    absl::Duration latency;
  };
  void Offer(const Call& call);

  int64_t lines() const { return lines_.load(); }      // written
  int64_t dropped() const { return dropped_.load(); }  // the queue was full, or the file could not be written
  int64_t redaction_failures() const { return redaction_failures_.load(); }  // lines written with null texts
  // Waits until every line queued so far is written (tests, shutdown).
  void Flush();

 private:
  explicit DecisionLog(Options options);
  void Run();
  struct Queued {
    std::string artifact, stamp;  // the version's artifact file and its time stamp when the call was answered
    std::string line;             // without the artifact's digest, which the writer adds
    absl::Time time;
    std::string trace_id, model, request_id;
    int64_t version = 0;
  };
  void Enqueue(Queued queued);
  // Per text, the bytes of each of its top words (the line's order).
  using TopWordRanges = std::vector<std::vector<std::pair<uint32_t, uint32_t>>>;
  // A line whose texts were (or could not be) redacted: filled in and queued.
  void Redacted(nlohmann::ordered_json line, Queued queued, const TopWordRanges& ranges,
                const absl::StatusOr<std::vector<RedactedText>>& masked);
  void RedactionDone();
  bool WriteFile(const std::string& line);
  void Write(Queued queued);
  void Rotate();
  std::string ArtifactSha256(const std::string& path, const std::string& stamp);

  const Options options_;
  std::atomic<const ModelRepository*> repository_{nullptr};
  std::atomic<int64_t> lines_{0}, dropped_{0}, redaction_failures_{0}, redacting_{0};
  Sink sink_;
  std::string redact_with_;
  TextRedactor redactor_;
  Mutex sample_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(sample_mu_);
  Mutex mu_;
  CondVar changed_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0, written_ ABSL_GUARDED_BY(mu_) = 0;
  // The writer's own.
  std::ofstream out_;
  int64_t bytes_ = 0;
  std::map<std::string, std::string> digests_;  // artifact path and stamp -> SHA-256
  std::thread writer_;
};

}  // namespace qvi

#endif  // QVI_SERVER_FRONTEND_DECISION_LOG_H_

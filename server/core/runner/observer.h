// What the serving core reports while it works, for metrics. The server plugs in Prometheus
// (server/metrics/); tests and tools may pass none. The core calls these from its model instance
// threads, on the batch path: implementations must be thread-safe, cheap and must not call back
// into the core.
#ifndef QVI_SERVER_CORE_RUNNER_OBSERVER_H_
#define QVI_SERVER_CORE_RUNNER_OBSERVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/core/request/request.h"

namespace qvi {

struct BatchReport {
  int texts = 0;
  int64_t tokens = 0;                       // real tokens
  int64_t padded_tokens = 0;                // texts x the longest text: what the model computed on
  absl::Duration compute;                   // from its launch to its outputs on the host, checked: inputs
                                            // packed, the forward pass, its outputs copied off the device,
                                            // the faithfulness checks (the answers are made after,
                                            // AnswerReport); pipelined, it overlaps the batch before it
  absl::Duration device;                    // of which the device was busy (ModelOutputs::device_time)
  std::vector<absl::Duration> queue_waits;  // per text: from joining the queue to the batch's start
  bool ok = true;                           // the model ran and its outputs passed the checks
  // When its turn began, in wall time (the spans' clock), and the spans of the exported calls whose
  // texts it ran, each once (empty when no call of the batch is traced for export).
  absl::Time start_wall;
  std::vector<SpanRef> spans;
};

// One share of a batch's answers (a chunk of its rows, on an answer thread or the instance thread):
// each text's row post-processed and its request completed (serialised, sent, logged).
struct AnswerReport {
  int texts = 0;
  absl::Duration wait;  // from the end of the batch's turn on its instance thread to this share's start
  absl::Duration run;   // rows and completions of this share
};

struct TextComparison;  // shadow_compare.h
struct DriftReading;    // serving/drift.h

class ServingObserver {
 public:
  virtual ~ServingObserver() = default;
  virtual void OnBatch(const std::string& model, int64_t version, const BatchReport& batch) = 0;
  // Texts waiting in a version's batch queue, after each change.
  virtual void OnQueueDepth(const std::string& model, int64_t version, size_t texts) = 0;
  // After each share of a batch's answers; called from the thread that made them.
  virtual void OnAnswers(const std::string& /*model*/, int64_t /*version*/, const AnswerReport& /*answers*/) {}
  // `texts` queued texts of priority `level` (1 high, 2 normal, 3 low) were shed, their requests
  // failed, to make room for a request of a higher priority; called from the thread that enqueued it.
  virtual void OnShed(const std::string& /*model*/, int64_t /*version*/, int /*level*/, size_t /*texts*/) {}
  // Shadow versions (serving/shadow.h): one text answered by the serving version `live` and its candidate
  // `shadow`, compared; once per mirrored request, the candidate's compute time less the serving version's.
  virtual void OnShadowCompared(const std::string& /*model*/, int64_t /*live*/, int64_t /*shadow*/,
                                const TextComparison& /*comparison*/) {}
  virtual void OnShadowLatency(const std::string& /*model*/, int64_t /*live*/, int64_t /*shadow*/,
                               absl::Duration /*difference*/) {}
  // `texts` mirrored texts dropped: "cpu", "busy", "shed" or "failed".
  virtual void OnShadowDropped(const std::string& /*model*/, int64_t /*live*/, int64_t /*shadow*/,
                               const char* /*reason*/, int64_t /*texts*/) {}
  // Drift gauges (serving/drift.h): a version's window of callers' texts against its card's reference, after
  // each answer; called from the thread that answered.
  virtual void OnDrift(const std::string& /*model*/, int64_t /*version*/, const DriftReading& /*reading*/) {}
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_RUNNER_OBSERVER_H_

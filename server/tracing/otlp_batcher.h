// The queue and thread of an OTLP/HTTP exporter, whatever it exports (spans: otlp_exporter.h; log records:
// otlp_logs.h). Export() puts an item in a bounded queue and returns; a full queue drops it and counts it. A
// thread of the batcher's own takes up to `max_batch` items at a time — when that many are waiting or every
// `flush_every` — encodes them into one body and posts it, with a timeout; a collector that is down or slow costs
// only that thread's time, and its items are counted as failed (no retries). What is queued at Stop() is sent
// once more, within the timeout.
#ifndef QVI_SERVER_TRACING_OTLP_BATCHER_H_
#define QVI_SERVER_TRACING_OTLP_BATCHER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/base/sync.h"

namespace qvi {

struct OtlpOptions {
  std::string endpoint;  // http://host:port, or with the path of the signal's route
  std::string service_name = "qvi-server";
  std::map<std::string, std::string> resource;  // more resource attributes (deployment.environment, ...)
  size_t max_queue = 2048;                      // items waiting, at most; beyond it they are dropped
  size_t max_batch = 512;                       // items per POST
  absl::Duration flush_every = absl::Seconds(1);
  absl::Duration timeout = absl::Seconds(5);  // connecting, sending and reading, each
  bool background = true;                     // false: nothing is sent but by ExportQueued() (tests)
};

// Where an OTLP/HTTP endpoint is: "http://host:port[/path]" (the path defaults to `default_path`).
// INVALID_ARGUMENT naming `flag` for anything else (https is not spoken: put a collector beside the
// server and let it forward with TLS).
struct OtlpTarget {
  std::string host;
  int port = 0;
  std::string path;
};
absl::StatusOr<OtlpTarget> ParseOtlpEndpoint(const std::string& endpoint, const char* flag = "--otlp-endpoint",
                                             const char* default_path = "/v1/traces");

// One POST of an encoded body (application/x-protobuf); UNAVAILABLE when the collector did not take it.
absl::Status PostOtlp(const OtlpTarget& target, absl::Duration timeout, const std::string& body);

template <typename Item>
class OtlpBatcher {
 public:
  // The body of one POST of `items`.
  using Encode = std::function<std::string(const OtlpOptions& options, const std::vector<Item>& items)>;
  // What became of items: "exported", "dropped" (the queue was full) or "failed" (the POST failed or was
  // refused); called from Export's caller (dropped) or the batcher's thread.
  using Counter = std::function<void(const char* outcome, int64_t items)>;
  // Failed POSTs, said at most once per flush (a collector down for an hour costs an hour of these lines).
  using Warn = std::function<void(const OtlpOptions& options, int64_t items, const absl::Status& why)>;

  OtlpBatcher(OtlpOptions options, OtlpTarget target, Encode encode, Counter counter, Warn warn)
      : options_(std::move(options)),
        target_(std::move(target)),
        encode_(std::move(encode)),
        counter_(std::move(counter)),
        warn_(std::move(warn)) {
    if (options_.background) thread_ = std::thread([this] { Loop(); });
  }
  ~OtlpBatcher() { Stop(); }

  const OtlpOptions& options() const { return options_; }

  void Export(Item item) ABSL_LOCKS_EXCLUDED(mu_) {
    bool taken = false, full_batch = false;
    {
      MutexLock lock(&mu_);
      if (queue_.size() < options_.max_queue && !stopping_) {
        queue_.push_back(std::move(item));
        taken = true;
        full_batch = queue_.size() == options_.max_batch;
      }
    }
    if (!taken) return Count("dropped", 1);
    if (full_batch) wake_.Signal();
  }

  // Sends what is queued now, in batches, on the calling thread; OK when every POST was taken.
  absl::Status ExportQueued() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock post(&post_mu_);
    absl::Status status;
    while (true) {
      std::vector<Item> batch;
      {
        MutexLock lock(&mu_);
        while (!queue_.empty() && batch.size() < options_.max_batch) {
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      if (batch.empty()) return status;
      const auto n = static_cast<int64_t>(batch.size());
      absl::Status posted = Post(batch);
      Count(posted.ok() ? "exported" : "failed", n);
      if (!posted.ok()) {
        if (warn_) warn_(options_, n, posted);
        status = posted;
      }
    }
  }

  // Sends what is queued once more and ends the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    wake_.SignalAll();
    if (thread_.joinable()) thread_.join();
    (void)ExportQueued();
  }

  size_t queued() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return queue_.size();
  }

 private:
  absl::Status Post(const std::vector<Item>& items) const {
    std::string body;
    try {
      body = encode_(options_, items);
    } catch (...) {
      return absl::InternalError("encoding failed");
    }
    return PostOtlp(target_, options_.timeout, body);
  }

  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      {
        MutexLock lock(&mu_);
        if (!stopping_ && queue_.size() < options_.max_batch) wake_.WaitWithTimeout(&mu_, options_.flush_every);
        if (stopping_) return;  // Stop() sends the rest
      }
      (void)ExportQueued();
    }
  }

  void Count(const char* outcome, int64_t items) const {
    if (counter_) counter_(outcome, items);
  }

  const OtlpOptions options_;
  const OtlpTarget target_;
  const Encode encode_;
  const Counter counter_;
  const Warn warn_;
  mutable Mutex mu_;
  CondVar wake_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Mutex post_mu_;  // one POST at a time: the thread's, or ExportQueued's
  std::thread thread_;
};

}  // namespace qvi

#endif  // QVI_SERVER_TRACING_OTLP_BATCHER_H_

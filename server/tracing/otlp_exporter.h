// Exports finished spans to an OpenTelemetry collector over OTLP/HTTP with protobuf bodies (POST
// {endpoint}/v1/traces, Content-Type application/x-protobuf; the messages of the vendored
// proto/opentelemetry), as Jaeger, Tempo and every OpenTelemetry Collector take them.
//
// A call never waits for the collector: Export() puts the span in a bounded queue and returns; a
// full queue drops the span and counts it. A thread of the exporter's own takes up to `max_batch`
// spans at a time — when that many are waiting or every `flush_every` — and posts them, with a
// timeout; a collector that is down or slow costs only that thread's time, and its spans are counted
// as failed (no retries: a trace is worth less than the memory that would keep it). What is queued at
// shutdown is sent once more, within the timeout.
#ifndef QVI_SERVER_TRACING_OTLP_EXPORTER_H_
#define QVI_SERVER_TRACING_OTLP_EXPORTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/base/sync.h"
#include "server/tracing/span.h"

namespace qvi {

struct OtlpOptions {
  std::string endpoint;  // http://host:port, or with the path of the traces route
  std::string service_name = "qvi-server";
  std::map<std::string, std::string> resource;  // more resource attributes (deployment.environment, ...)
  size_t max_queue = 2048;                      // spans waiting, at most; beyond it they are dropped
  size_t max_batch = 512;                       // spans per POST
  absl::Duration flush_every = absl::Seconds(1);
  absl::Duration timeout = absl::Seconds(5);  // connecting, sending and reading, each
  bool background = true;                     // false: nothing is sent but by ExportQueued() (tests)
};

// Where an OTLP/HTTP endpoint is: "http://host:port[/path]" (the path defaults to /v1/traces).
// INVALID_ARGUMENT naming the flag for anything else (https is not spoken: put a collector beside the
// server and let it forward with TLS).
struct OtlpTarget {
  std::string host;
  int port = 0;
  std::string path;
};
absl::StatusOr<OtlpTarget> ParseOtlpEndpoint(const std::string& endpoint);

// "key=value,key=value" (OTEL_RESOURCE_ATTRIBUTES' form) as a map; INVALID_ARGUMENT naming the pair.
absl::StatusOr<std::map<std::string, std::string>> ParseResourceAttributes(const std::string& text);

// The body of one POST: an ExportTraceServiceRequest of `spans` under one resource and scope.
std::string EncodeSpans(const OtlpOptions& options, const std::vector<Span>& spans);

class OtlpExporter final : public SpanSink {
 public:
  // What became of spans: "exported", "dropped" (the queue was full) or "failed" (the POST failed or
  // was refused); called from Export's caller (dropped) or the exporter's thread.
  using Counter = std::function<void(const char* outcome, int64_t spans)>;

  // INVALID_ARGUMENT for an endpoint ParseOtlpEndpoint refuses.
  static absl::StatusOr<std::unique_ptr<OtlpExporter>> Create(OtlpOptions options, Counter counter = nullptr);
  ~OtlpExporter() override;  // Stop()

  void Export(Span span) override ABSL_LOCKS_EXCLUDED(mu_);

  // Sends what is queued now, in batches, on the calling thread; OK when every POST was taken.
  absl::Status ExportQueued() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends what is queued once more and ends the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  size_t queued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  OtlpExporter(OtlpOptions options, OtlpTarget target, Counter counter);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Post(const std::vector<Span>& spans) const;
  void Count(const char* outcome, int64_t spans) const {
    if (counter_) counter_(outcome, spans);
  }

  const OtlpOptions options_;
  const OtlpTarget target_;
  const Counter counter_;
  mutable Mutex mu_;
  CondVar wake_;
  std::deque<Span> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Mutex post_mu_;  // one POST at a time: the thread's, or ExportQueued's
  std::thread thread_;
};

}  // namespace qvi

#endif  // QVI_SERVER_TRACING_OTLP_EXPORTER_H_

// Exports finished spans to an OpenTelemetry collector over OTLP/HTTP with protobuf bodies (POST
// {endpoint}/v1/traces, Content-Type application/x-protobuf; the messages of the vendored
// proto/opentelemetry), as Jaeger, Tempo and every OpenTelemetry Collector take them.
//
// A call never waits for the collector: Export() puts the span in a bounded queue and returns; a
// full queue drops the span and counts it; a thread of the exporter's own posts them in batches
// (otlp_batcher.h: no retries, a trace is worth less than the memory that would keep it).
#ifndef QVI_SERVER_TRACING_OTLP_EXPORTER_H_
#define QVI_SERVER_TRACING_OTLP_EXPORTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/tracing/otlp_batcher.h"
#include "server/tracing/span.h"

namespace qvi {

// "key=value,key=value" (OTEL_RESOURCE_ATTRIBUTES' form) as a map; INVALID_ARGUMENT naming the pair.
absl::StatusOr<std::map<std::string, std::string>> ParseResourceAttributes(const std::string& text);

// The body of one POST: an ExportTraceServiceRequest of `spans` under one resource and scope.
std::string EncodeSpans(const OtlpOptions& options, const std::vector<Span>& spans);

// One log record: the decision log's lines (--decision-log-otlp-endpoint), as OTLP logs beside the traces.
struct LogRecord {
  absl::Time time;
  std::string event_name;
  std::string body;                 // a string body (the decision's JSON line)
  std::optional<TraceId> trace_id;  // the call's trace, when it has one
  std::vector<std::pair<std::string, Span::Value>> attributes;
};

// The body of one POST: an ExportLogsServiceRequest of `records` under one resource and scope.
std::string EncodeLogs(const OtlpOptions& options, const std::vector<LogRecord>& records);

// Log records to {endpoint}/v1/logs (otlp_batcher.h: queued, batched, dropped and failed counted).
class OtlpLogExporter {
 public:
  using Counter = OtlpBatcher<LogRecord>::Counter;
  // INVALID_ARGUMENT, naming `flag`, for an endpoint ParseOtlpEndpoint refuses.
  static absl::StatusOr<std::unique_ptr<OtlpLogExporter>> Create(OtlpOptions options, const char* flag,
                                                                 Counter counter = nullptr);
  void Export(LogRecord record) { batcher_.Export(std::move(record)); }
  absl::Status ExportQueued() { return batcher_.ExportQueued(); }
  void Stop() { batcher_.Stop(); }
  size_t queued() const { return batcher_.queued(); }

 private:
  OtlpLogExporter(OtlpOptions options, OtlpTarget target, Counter counter);
  OtlpBatcher<LogRecord> batcher_;
};

class OtlpExporter final : public SpanSink {
 public:
  // What became of spans: "exported", "dropped" (the queue was full) or "failed" (the POST failed or
  // was refused); called from Export's caller (dropped) or the exporter's thread.
  using Counter = OtlpBatcher<Span>::Counter;

  // INVALID_ARGUMENT for an endpoint ParseOtlpEndpoint refuses.
  static absl::StatusOr<std::unique_ptr<OtlpExporter>> Create(OtlpOptions options, Counter counter = nullptr);
  ~OtlpExporter() override { Stop(); }

  void Export(Span span) override { batcher_.Export(std::move(span)); }

  // Sends what is queued now, in batches, on the calling thread; OK when every POST was taken.
  absl::Status ExportQueued() { return batcher_.ExportQueued(); }
  // Sends what is queued once more and ends the thread. Idempotent.
  void Stop() { batcher_.Stop(); }

  size_t queued() const { return batcher_.queued(); }

 private:
  OtlpExporter(OtlpOptions options, OtlpTarget target, Counter counter);
  OtlpBatcher<Span> batcher_;
};

}  // namespace qvi

#endif  // QVI_SERVER_TRACING_OTLP_EXPORTER_H_

#include "server/tracing/tracing_observer.h"

namespace qvi {

Span BatchSpan(const std::string& model, int64_t version, const BatchReport& report) {
  Span s;
  s.trace_id = NewTraceId();
  s.span_id = NewSpanId();
  s.name = "qvi.batch";
  s.start = report.start_wall;
  s.end = report.start_wall + report.compute;
  s.Set("qvi.model", model);
  s.Set("qvi.version", version);
  s.Set("qvi.batch.texts", static_cast<int64_t>(report.texts));
  s.Set("qvi.batch.tokens", report.tokens);
  s.Set("qvi.batch.padded_tokens", report.padded_tokens);
  s.Set("qvi.batch.device_ms", absl::ToDoubleMilliseconds(report.device));
  s.links = report.spans;
  if (!report.ok) {
    s.status = Span::Status::kError;
    s.status_message = "the model failed on this batch, or its outputs failed the checks";
  }
  return s;
}

}  // namespace qvi

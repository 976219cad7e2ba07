// W3C Trace Context (https://www.w3.org/TR/trace-context/): the `traceparent` a caller sends with a
// call (gRPC metadata, an HTTP header), and which calls get per-request timings in the access log.
// The ids themselves, and the one random draw, are span.h's.
//
// A call is traced when it brings a valid traceparent (its caller traces it) or, failing that, when a
// draw falls under --trace-rate; a call traced by the draw gets a trace id of its own. The trace id
// goes into the access line and every log line about the call; the timings (prepare, queue, forward,
// post-process, serialise) into the access line of a traced call. This is what Triton's default
// trace mode and TEI write; the spans exported over OTLP are span.h's and otlp_exporter.h's.
#ifndef QVI_SERVER_TRACING_TRACE_CONTEXT_H_
#define QVI_SERVER_TRACING_TRACE_CONTEXT_H_

#include <optional>
#include <string>
#include <string_view>

namespace qvi {

struct TraceParent {
  std::string trace_id;   // 32 lowercase hex digits, not all zero
  std::string parent_id;  // 16 lowercase hex digits, not all zero
  bool sampled = false;   // the caller's sampled flag
};

// The header's value parsed by the rules of version 00 (later versions: their first four fields);
// nullopt when it is not valid, which the specification says to treat as no header at all.
std::optional<TraceParent> ParseTraceParent(std::string_view value);

// Decides per call whether it is traced, and makes trace ids for the calls traced by the draw.
class Tracer {
 public:
  explicit Tracer(double rate) : rate_(rate) {}
  // The trace id of a call traced by the draw (span.h's NewTraceId, as 32 lowercase hex digits), or ""
  // when the draw says no. Thread-safe.
  std::string Draw() const;

 private:
  const double rate_;
};

}  // namespace qvi

#endif  // QVI_SERVER_TRACING_TRACE_CONTEXT_H_

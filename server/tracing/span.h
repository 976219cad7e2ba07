// A finished span as qvi-server exports it (OTLP, otlp_exporter.h): ids, name, kind, wall-clock times,
// attributes, links and status, in OpenTelemetry's terms. Spans are made once their work is over (a
// call when it is recorded, a batch when it has run), so nothing here is shared or mutable.
#ifndef QVI_SERVER_TRACING_SPAN_H_
#define QVI_SERVER_TRACING_SPAN_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/time/time.h"
#include "server/core/request/request.h"

namespace qvi {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

struct Span {
  enum class Kind { kInternal = 1, kServer = 2 };  // OTLP's SpanKind numbers
  enum class Status { kUnset = 0, kOk = 1, kError = 2 };
  using Value = std::variant<std::string, int64_t, double, bool>;

  TraceId trace_id{};
  SpanId span_id{};
  std::optional<SpanId> parent;
  std::string name;
  Kind kind = Kind::kInternal;
  absl::Time start, end;  // wall time
  std::vector<std::pair<std::string, Value>> attributes;
  std::vector<SpanRef> links;
  Status status = Status::kUnset;
  std::string status_message;

  void Set(std::string key, Value value) { attributes.emplace_back(std::move(key), std::move(value)); }
};

// Random ids, never all zero (W3C Trace Context and OTLP call all-zero ids invalid). Thread-safe. The
// only ids the server makes: a span's, an exported trace's, and a trace id for the access log (Tracer).
TraceId NewTraceId();
SpanId NewSpanId();
// True with probability `ratio` (never at 0 or below, always at 1 or above), from the same generator.
// Thread-safe.
bool Drawn(double ratio);

// Ids from and to lowercase hex (a traceparent's fields); nullopt when `hex` is not one.
std::optional<TraceId> TraceIdFromHex(std::string_view hex);
std::optional<SpanId> SpanIdFromHex(std::string_view hex);
std::string ToHex(const uint8_t* bytes, size_t n);
template <size_t N>
std::string ToHex(const std::array<uint8_t, N>& id) {
  return ToHex(id.data(), N);
}

// Where finished spans go. Export never blocks on the network and never fails the caller: an exporter
// that cannot take a span drops and counts it.
class SpanSink {
 public:
  virtual ~SpanSink() = default;
  virtual void Export(Span span) = 0;
};

// Whether a call's trace is exported: parent-based, as OpenTelemetry's default sampler. A call whose
// traceparent says sampled is; one whose traceparent says not sampled is not; one without a
// traceparent is with probability `ratio` (--otlp-sampling-ratio).
class SpanSampler {
 public:
  explicit SpanSampler(double ratio) : ratio_(ratio) {}
  // `parent_sampled`: the traceparent's flag, nullopt without a (valid) traceparent. Thread-safe.
  bool Sample(std::optional<bool> parent_sampled) const;

 private:
  const double ratio_;
};

}  // namespace qvi

#endif  // QVI_SERVER_TRACING_SPAN_H_

// The spans of a finished call whose trace is exported (--otlp-endpoint), in OpenTelemetry's terms:
//
//   <method>            SERVER; the caller's traceparent its parent; the whole call, as the client saw it
//   ├─ qvi.load_wait    only for a call that waited for its model to load on demand: from the first wait's
//   │                   start to the last one's end (within qvi.prepare's time, or the call's if refused)
//   ├─ qvi.prepare      admission, decoding, checks and tokenising, until its first text joined the queue
//   ├─ qvi.queue        the batch queue, until the batch that ran its last text began
//   ├─ qvi.postprocess  its rows of the batch's outputs made into results (the forward pass is the
//   │                   batch's span, qvi.batch, which links to this call's)
//   └─ qvi.answer       the answer built and serialised
//
// The children are placed from the answer's timings (AnswerSummary); a call refused before it was
// queued has its own span only, with the error as its status.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/request/request_checks.h"
#include "server/frontend/call.h"

namespace qvi {

namespace {

Span Child(const Span& call, const char* name, absl::Time start, absl::Duration length) {
  Span s;
  s.trace_id = call.trace_id;
  s.span_id = NewSpanId();
  s.parent = call.span_id;
  s.name = name;
  s.start = start;
  s.end = start + std::max(length, absl::ZeroDuration());
  return s;
}

}  // namespace

void Calls::ExportSpans(const Call& call, const absl::Status& status, const AnswerSummary* answer) const {
  // The core's clock is monotonic; spans are in wall time. One offset for the whole call.
  const absl::Time now = env().Now();
  const absl::Duration to_wall = absl::Now() - now;
  Span s;
  s.trace_id = call.span_.trace_id;
  s.span_id = call.span_.span_id;
  s.parent = call.span_.parent;
  s.name = call.method_;
  s.kind = Span::Kind::kServer;
  s.start = call.start_ + to_wall;
  s.end = now + to_wall;
  s.Set("qvi.model", Capped(call.model));
  s.Set("qvi.request_id", Capped(call.request_id_));
  s.Set("qvi.texts", call.texts_);
  s.Set("qvi.outputs", call.explain_);
  s.Set("rpc.grpc.status_code", static_cast<int64_t>(status.code()));
  if (answer != nullptr) {
    s.Set("qvi.version", answer->version);
    s.Set("qvi.tokens", answer->tokens);
    s.Set("qvi.answer_bytes", answer->bytes);
  }
  if (!status.ok()) {
    s.status = Span::Status::kError;
    s.status_message = absl::StrCat(StatusCodeName(status.code()), ": ", status.message().substr(0, 256));
  }
  std::vector<Span> spans;
  if (call.load_wait_start != absl::InfiniteFuture()) {
    const absl::Time end = call.load_wait_end != absl::InfiniteFuture() ? call.load_wait_end : now;
    spans.push_back(Child(s, "qvi.load_wait", call.load_wait_start + to_wall, end - call.load_wait_start));
  }
  if (answer != nullptr && answer->queued_at != absl::InfiniteFuture()) {
    const absl::Time queued = answer->queued_at + to_wall;
    const absl::Time batch = queued + answer->queue;
    spans.push_back(Child(s, "qvi.prepare", s.start, queued - s.start));
    spans.push_back(Child(s, "qvi.queue", queued, answer->queue));
    spans.push_back(Child(s, "qvi.postprocess", batch + answer->forward, answer->postprocess));
    spans.push_back(Child(s, "qvi.answer", batch + answer->compute, answer->serialize));
  } else if (answer != nullptr) {  // answered without the model (the response cache knew every text)
    spans.push_back(Child(s, "qvi.answer", s.end - answer->serialize, answer->serialize));
  }
  options_.spans->Export(std::move(s));
  for (Span& child : spans) options_.spans->Export(std::move(child));
}

}  // namespace qvi

// The batch spans of exported traces: a ServingObserver in front of the server's own (metrics) that
// passes every event on and, for a batch that ran texts of calls whose trace is exported, exports a
// span of its own — `qvi.batch`, the forward pass of the batch (packing, the model, its outputs off the
// device, the faithfulness checks), with its size and device time — in a trace of its own, linked to
// the span of every such call in it (a batch serves many traces: a link each, OpenTelemetry's way of
// saying so, rather than a parent).
#ifndef QVI_SERVER_TRACING_TRACING_OBSERVER_H_
#define QVI_SERVER_TRACING_TRACING_OBSERVER_H_

#include <string>

#include "server/core/runner/observer.h"
#include "server/tracing/span.h"

namespace qvi {

// The span of a batch that `report` describes.
Span BatchSpan(const std::string& model, int64_t version, const BatchReport& report);

class TracingObserver final : public ServingObserver {
 public:
  // `next` may be null; `sink` must outlive the observer.
  TracingObserver(ServingObserver* next, SpanSink* sink) : next_(next), sink_(sink) {}

  void OnBatch(const std::string& model, int64_t version, const BatchReport& batch) override {
    if (next_ != nullptr) next_->OnBatch(model, version, batch);
    if (!batch.spans.empty()) sink_->Export(BatchSpan(model, version, batch));
  }
  void OnQueueDepth(const std::string& model, int64_t version, size_t texts) override {
    if (next_ != nullptr) next_->OnQueueDepth(model, version, texts);
  }
  void OnAnswers(const std::string& model, int64_t version, const AnswerReport& answers) override {
    if (next_ != nullptr) next_->OnAnswers(model, version, answers);
  }
  void OnShed(const std::string& model, int64_t version, int level, size_t texts) override {
    if (next_ != nullptr) next_->OnShed(model, version, level, texts);
  }

 private:
  ServingObserver* const next_;
  SpanSink* const sink_;
};

}  // namespace qvi

#endif  // QVI_SERVER_TRACING_TRACING_OBSERVER_H_

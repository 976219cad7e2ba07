#include "server/grpc/infer_call.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/spec/request_checks.h"
#include "server/grpc/convert.h"
#include "server/logging.h"

namespace qvi {

absl::Time Deadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

std::string InferCalls::NextRequestId() { return absl::StrCat("req-", next_id_.fetch_add(1)); }

void InferCalls::Record(const char* method, const std::string& peer, const std::string& model,
                        const std::string& request_id, int64_t texts, const grpc::Status& status, absl::Time start,
                        const AnswerSummary* answer, const CallTrace& trace) const {
  const absl::Duration latency = repository_->env()->Now() - start;
  const int64_t version = answer != nullptr ? answer->version : 0;
  const std::string code = StatusCodeName(status.error_code());
  if (options_.access_log) {
    AccessRecord a;
    a.method = method;
    a.peer = peer;
    a.model = Capped(model);
    a.version = version;
    a.request_id = Capped(request_id);
    a.texts = texts;
    a.code = static_cast<int>(status.error_code());
    a.code_name = code;
    a.ms = absl::ToDoubleMilliseconds(latency);
    a.trace_id = trace.trace_id;
    a.traced = trace.traced;
    if (answer != nullptr) {
      a.tokens = answer->tokens;
      a.queue_ms = absl::ToDoubleMilliseconds(answer->queue);
      a.compute_ms = absl::ToDoubleMilliseconds(answer->compute);
      if (answer->queued_at != absl::InfiniteFuture()) {
        a.prepare_ms = absl::ToDoubleMilliseconds(answer->queued_at - start);
      }
      a.forward_ms = absl::ToDoubleMilliseconds(answer->forward);
      a.postprocess_ms = absl::ToDoubleMilliseconds(answer->postprocess);
      a.serialize_ms = absl::ToDoubleMilliseconds(answer->serialize);
    }
    LogAccess(a);
  }
  // Counted after its access line is queued: once qvi_requests_total shows a call, its line is in
  // the queue, on stderr or counted as dropped (the blocked-stderr test waits on exactly that).
  if (options_.metrics != nullptr) {
    // Only names in the store become label values (see metrics.h).
    const bool known = version > 0 || repository_->Has(model);
    options_.metrics->OnRequestDone(method, known ? model : "_unknown", version, code, latency);
  }
}

CallTrace InferCalls::TraceOf(std::string_view traceparent) const {
  CallTrace trace;
  if (!options_.access_log) return trace;
  // A caller's valid traceparent traces the call under its trace id; otherwise the draw decides.
  if (std::optional<TraceParent> parent = ParseTraceParent(traceparent)) return CallTrace{parent->trace_id, true};
  trace.trace_id = tracer_.Draw();
  trace.traced = !trace.trace_id.empty();
  return trace;
}

void InferCalls::OnCallStart() const {
  if (options_.metrics != nullptr) options_.metrics->OnRequestStart();
}

absl::Status InferCalls::CheckHeld(int64_t held, int64_t answer_bytes) const {
  const int64_t limit = options_.max_inflight_request_bytes;
  if (limit <= 0 || held <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      answer_bytes > 0 ? absl::StrCat("requests in flight and their answers would hold ", held,
                                      " bytes (this answer about ", answer_bytes, "), over the limit of ", limit,
                                      " bytes (--max-inflight-request-bytes); retry with backoff")
                       : absl::StrCat("requests in flight would hold ", held, " bytes, over the limit of ", limit,
                                      " bytes (--max-inflight-request-bytes); retry with backoff"));
}

grpc::Status InferCalls::CheckResponseSize(grpc::ByteBuffer* response) const {
  if (options_.max_response_bytes <= 0 || static_cast<int64_t>(response->Length()) <= options_.max_response_bytes) {
    return grpc::Status::OK;
  }
  grpc::Status status(
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      absl::StrCat("the answer is ", response->Length(), " bytes, over the limit of ", options_.max_response_bytes,
                   " bytes (--max-message-bytes); ask for fewer texts or outputs"));
  response->Clear();
  return status;
}

InferCall::InferCall(InferCalls* calls, grpc::CallbackServerContext* ctx, const char* method, int64_t request_bytes)
    : calls_(calls), ctx_(ctx), method_(method), start_(calls->repository_->env()->Now()), bytes_(request_bytes) {
  if (calls_->options_.access_log) {
    peer_ = ctx->peer();
    const auto& metadata = ctx->client_metadata();
    const auto header = metadata.find("traceparent");
    trace_ = calls_->TraceOf(header == metadata.end() ? std::string_view()
                                                      : std::string_view(header->second.data(), header->second.size()));
  }
  if (calls_->options_.metrics != nullptr) calls_->options_.metrics->OnRequestStart();
  // Memory admitted by bytes: the request's bytes count against the limit until it is answered.
  held_ = calls_->inflight_bytes_.fetch_add(bytes_) + bytes_;
}

grpc::Status InferCall::Admission() const { return ToGrpcStatus(calls_->CheckHeld(held_, 0)); }

absl::Status InferCall::HoldAnswer(int64_t answer_bytes) {
  int64_t none = 0;
  if (answered_.load() || answer_bytes <= 0 || !answer_bytes_.compare_exchange_strong(none, answer_bytes)) {
    return absl::OkStatus();  // answered already, nothing to hold, or held once already
  }
  return calls_->CheckHeld(calls_->HoldBytes(answer_bytes), answer_bytes);
}

void InferCall::Answer(const grpc::Status& status, const AnswerSummary* answer) {
  if (answered_.exchange(true)) return;
  // The request's bytes, and its answer's estimate, stop counting against --max-inflight-request-bytes
  // once its answer is handed over: a client that has its answer (a refusal included) may send the
  // next request at once, and gRPC's own buffers until OnDone are bounded by its resource quota.
  calls_->inflight_bytes_.fetch_sub(bytes_ + answer_bytes_.load());
  status_ = status;
  if (answer != nullptr) answer_ = *answer;
  answer_valid_ = answer != nullptr;
  Finish(status);
}

void InferCall::OnDone() {
  grpc::Status seen = status_;
  if (ctx_->IsCancelled()) {
    // The client never got this status: its deadline passed, it cancelled, or the connection broke.
    const bool expired = Deadline(ctx_) <= absl::Now();
    seen = grpc::Status(expired ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::CANCELLED,
                        "the answer did not reach the client");
  }
  try {
    calls_->Record(method_, peer_, model, request_id, texts, seen, start_,
                   answer_valid_ && seen.ok() ? &answer_ : nullptr, trace_);
  } catch (...) {
    spdlog::error("counting a finished {} call (request_id {}, trace_id {}) failed: {}", method_, Capped(request_id),
                  trace_.trace_id.empty() ? "none" : trace_.trace_id, CurrentExceptionText());
  }
  delete this;
}

}  // namespace qvi

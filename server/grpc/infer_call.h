// What every inference call shares, whichever API it came by (qvi.serving.v1.Inference or the Open
// Inference Protocol): the memory admitted by request bytes, the request ids made up for calls
// without one, the send limit, and the counting of each call once it is over (metrics, access log).
//
// StartInferCall() is the skeleton both APIs' inference methods share: admission, the API's own
// parsing and planning, the request id, the deadline, Submit, and the catch that keeps a failure
// (std::bad_alloc, say) to its own call.
//
// InferCall is the reactor of one such call, from its arrival to gRPC's OnDone. Answer() finishes
// it once (a second answer is ignored) and releases its request bytes; OnDone() counts it with the
// status the client really got, and deletes it: an answer that never reached the client (cut by a
// deadline, a cancellation or a closed connection after the model ran) counts as
// DEADLINE_EXCEEDED or CANCELLED, never as OK.
#ifndef QVI_SERVER_GRPC_INFER_CALL_H_
#define QVI_SERVER_GRPC_INFER_CALL_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/core/serving/inference_service.h"
#include "server/core/serving/model_repository.h"
#include "server/core/spec/request.h"
#include "server/grpc/convert.h"
#include "server/grpc/trace_context.h"
#include "server/logging.h"
#include "server/metrics/metrics.h"

namespace qvi {

// What the access log and the metrics keep of an answer.
struct AnswerSummary {
  int64_t version = 0;
  int64_t tokens = 0;
  absl::Duration queue, compute;
  // For traced calls (trace_context.h): when its first text joined the batch queue, the split of
  // `compute`, and the time to build and serialise the API's answer.
  absl::Time queued_at = absl::InfiniteFuture();
  absl::Duration forward, postprocess, serialize;
};

// A call's trace (trace_context.h): its trace id ("" for none) and whether its timings are logged.
struct CallTrace {
  std::string trace_id;
  bool traced = false;
};

class InferCalls {
 public:
  struct Options {
    bool access_log = false;
    Metrics* metrics = nullptr;  // may be null
    // Bytes of inference requests received and not yet answered, with their answers' estimated sizes,
    // at most, over both APIs. A call whose request would go over is refused at once with
    // RESOURCE_EXHAUSTED, before it is parsed; one whose answer would, once its answer is estimated,
    // before it is queued. 0: no limit.
    int64_t max_inflight_request_bytes = 0;
    // The largest answer sent (the server's send limit, --max-message-bytes). 0: no limit.
    int64_t max_response_bytes = 0;
    // The share of calls without a traceparent whose timings the access log gets (--trace-rate).
    double trace_rate = 0;
  };

  InferCalls(const ModelRepository* repository, Options options)
      : repository_(repository), options_(options), tracer_(options.trace_rate) {}

  const Options& options() const { return options_; }

  // "req-N", for calls that brought no id of their own.
  std::string NextRequestId();

  // A call's trace when the access log is on: the trace id of its valid `traceparent` header (traced),
  // else the draw of --trace-rate. Empty when the access log is off.
  CallTrace TraceOf(std::string_view traceparent) const;

  // Counts and logs one finished call. `method` is the metric's and the access log's method label.
  void Record(const char* method, const std::string& peer, const std::string& model, const std::string& request_id,
              int64_t texts, const grpc::Status& status, absl::Time start, const AnswerSummary* answer,
              const CallTrace& trace = {}) const;

  // For an API outside gRPC (HTTP, http_api.cc), what InferCall does for a gRPC call: counts the
  // call as started; holds bytes against --max-inflight-request-bytes (returning the total held)
  // and releases them; and says whether a total held, `answer_bytes` of it an answer's estimate,
  // is over the limit (RESOURCE_EXHAUSTED).
  void OnCallStart() const;
  int64_t HoldBytes(int64_t bytes) { return inflight_bytes_.fetch_add(bytes) + bytes; }
  void ReleaseBytes(int64_t bytes) { inflight_bytes_.fetch_sub(bytes); }
  absl::Status CheckHeld(int64_t held, int64_t answer_bytes) const;
  const Env& env() const { return *repository_->env(); }

  // OK, or RESOURCE_EXHAUSTED saying so when a serialised answer is over the send limit (and then
  // the buffer is cleared).
  grpc::Status CheckResponseSize(grpc::ByteBuffer* response) const;

 private:
  friend class InferCall;
  const ModelRepository* repository_;
  const Options options_;
  const Tracer tracer_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> inflight_bytes_{0};
};

class InferCall final : public grpc::ServerUnaryReactor {
 public:
  // Counts the call as started and its request's bytes as held.
  InferCall(InferCalls* calls, grpc::CallbackServerContext* ctx, const char* method, int64_t request_bytes);

  // RESOURCE_EXHAUSTED when this call's bytes took the bytes in flight over the limit: answer that.
  grpc::Status Admission() const;

  // Counts the answer's estimated bytes as held with the request's until the call is answered;
  // RESOURCE_EXHAUSTED when they take the bytes in flight over the limit (InferenceRequest::
  // hold_answer_bytes). Called at most once, before the call is answered.
  absl::Status HoldAnswer(int64_t answer_bytes);

  void Answer(const grpc::Status& status, const AnswerSummary* answer = nullptr);

  // Answers with the core's answer, or its error. `build(answer, &message)` fills the API's
  // message (a non-OK status refuses it); the message is serialised into `raw`. An answer over the
  // send limit is RESOURCE_EXHAUSTED, and a failure while building it (std::bad_alloc, say) INTERNAL:
  // nothing on the answer path throws into gRPC.
  template <typename Message, typename Build>
  void AnswerWith(const absl::StatusOr<InferenceResponse>& answer, grpc::ByteBuffer* raw, Build&& build);

  void OnDone() override;

  // Set while the call is prepared, before it is handed to the core.
  std::string model, request_id;
  int64_t texts = 0;

 private:
  InferCalls* const calls_;
  grpc::CallbackServerContext* const ctx_;
  const char* const method_;
  const absl::Time start_;
  const int64_t bytes_;
  int64_t held_ = 0;                      // the bytes in flight with this call's
  std::atomic<int64_t> answer_bytes_{0};  // the answer's estimate, held since HoldAnswer
  std::string peer_;
  CallTrace trace_;  // read when the access log is on
  std::atomic<bool> answered_{false};
  // Written by Answer() before Finish(); read in OnDone(), which gRPC runs after it.
  grpc::Status status_;
  AnswerSummary answer_;
  bool answer_valid_ = false;
};

// The call's deadline as gRPC gives it, in wall time (InfiniteFuture when it has none); the core takes it
// through MonotonicDeadline.
absl::Time Deadline(const grpc::CallbackServerContext* ctx);

// What an API makes of one call once it has parsed and checked it.
template <typename Message>
struct PlannedCall {
  Method method = Method::kClassify;
  InferenceRequest request;  // request_id: the client's, or empty for one made up here
  // The version the plan was checked against (OIP reads its manifest to plan the tensors): the
  // core answers from it. Null: the core resolves the request's model and version, once.
  ServableHandle servable;
  absl::Duration timeout = absl::InfiniteDuration();  // the API's own timeout, beside gRPC's deadline
  // Fills the API's message from the core's answer; a non-OK status refuses the answer.
  std::function<grpc::Status(const InferenceResponse&, Message*)> build;
};

// Starts one inference call: admission by request bytes; then `plan(raw, call)`, which parses and
// checks the request and returns a PlannedCall<Message> or the error to answer (it may set
// call->model and call->request_id as soon as it knows them, so that a refusal is logged and
// counted with them); then the request id, the deadline (the sooner of gRPC's and the plan's
// timeout), cancellation, and Submit. The call answers exactly once, whatever fails.
template <typename Message, typename Plan>
grpc::ServerUnaryReactor* StartInferCall(InferCalls* calls, InferenceService* core, const char* method,
                                         grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                         grpc::ByteBuffer* raw_response, Plan&& plan) {
  auto* call = new InferCall(calls, ctx, method, static_cast<int64_t>(raw->Length()));
  if (grpc::Status admitted = call->Admission(); !admitted.ok()) {
    call->Answer(admitted);
    return call;
  }
  try {
    absl::StatusOr<PlannedCall<Message>> planned = plan(*raw, call);
    if (!planned.ok()) {
      call->Answer(ToGrpcStatus(planned.status()));
      return call;
    }
    InferenceRequest& r = planned->request;
    if (r.request_id.empty()) r.request_id = call->request_id.empty() ? calls->NextRequestId() : call->request_id;
    call->model = r.model;
    call->request_id = r.request_id;
    call->texts = static_cast<int64_t>(r.texts.size());
    const Env& env = core->env();
    r.deadline = MonotonicDeadline(env, Deadline(ctx));
    if (planned->timeout != absl::InfiniteDuration()) r.deadline = std::min(r.deadline, env.Now() + planned->timeout);
    r.is_cancelled = [ctx] { return ctx->IsCancelled(); };
    r.hold_answer_bytes = [call](int64_t bytes) { return call->HoldAnswer(bytes); };
    core->Submit(
        planned->method, std::move(r),
        [call, raw_response, build = std::move(planned->build)](absl::StatusOr<InferenceResponse> out) {
          call->AnswerWith<Message>(out, raw_response, build);
        },
        std::move(planned->servable));
  } catch (...) {  // bad_alloc parsing or planning: this call fails, the server goes on
    call->Answer(grpc::Status(grpc::StatusCode::INTERNAL,
                              absl::StrCat("accepting the request failed: ", CurrentExceptionText())));
  }
  return call;
}

template <typename Message, typename Build>
void InferCall::AnswerWith(const absl::StatusOr<InferenceResponse>& answer, grpc::ByteBuffer* raw, Build&& build) {
  if (!answer.ok()) {
    Answer(ToGrpcStatus(answer.status()));
    return;
  }
  grpc::Status status;
  const Env* env = calls_->repository_->env();
  const absl::Time building = env->Now();
  try {
    Message message;
    status = build(*answer, &message);
    if (status.ok()) {
      bool own = false;
      status = grpc::SerializationTraits<Message>::Serialize(message, raw, &own);
    }
    if (status.ok()) status = calls_->CheckResponseSize(raw);
  } catch (...) {
    status =
        grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("building the answer failed: ", CurrentExceptionText()));
  }
  const AnswerSummary summary{answer->version,   answer->tokens,       answer->queue_time,       answer->compute_time,
                              answer->queued_at, answer->forward_time, answer->postprocess_time, env->Now() - building};
  Answer(status, status.ok() ? &summary : nullptr);
}

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_INFER_CALL_H_

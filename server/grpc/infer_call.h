// A gRPC inference call (qvi.serving.v1's Classify and Tag, OIP's ModelInfer) as a reactor around the
// protocol-neutral Call (server/frontend/call.h): gRPC's deadline, cancellation, peer and
// `traceparent` metadata in, the serialised answer and its status out.
//
// StartInferCall() is what both gRPC APIs share: admission, then the steps of every call (plan, wait for
// a load, prepare, submit: server/frontend/infer_steps.h) with gRPC's deadline, cancellation and message.
// The call is recorded in OnDone, with the status the client really got.
#ifndef QVI_SERVER_GRPC_INFER_CALL_H_
#define QVI_SERVER_GRPC_INFER_CALL_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/frontend/infer_steps.h"
#include "server/grpc/status.h"

namespace qvi {

class InferCall final : public grpc::ServerUnaryReactor {
 public:
  InferCall(Calls* calls, grpc::CallbackServerContext* ctx, const char* method, int64_t request_bytes);

  // Answers once (a second answer is ignored) and releases what the call held.
  void Answer(const absl::Status& status, const AnswerSummary* answer = nullptr);

  // Answers with the core's answer, or its error: `build(answer, &message)` fills the API's message
  // (a non-OK status refuses it), which is serialised into `raw`.
  template <typename Message, typename Build>
  void AnswerWith(const absl::StatusOr<InferenceResponse>& answer, grpc::ByteBuffer* raw, Build&& build);

  void OnDone() override;

  Call& call() { return call_; }
  grpc::CallbackServerContext* context() const { return ctx_; }
  // What GrpcSteps asks of a call (an InferCall, or one request of a stream, infer_stream.h): the
  // deadline in wall time, and whether the client has gone.
  absl::Time deadline() const;
  std::function<bool()> is_cancelled() const {
    return [ctx = ctx_] { return ctx->IsCancelled(); };
  }

 private:
  grpc::CallbackServerContext* const ctx_;
  Call call_;
  // Written by Answer() before Finish(); read in OnDone(), which gRPC runs after it.
  absl::Status status_;
  AnswerSummary answer_;
  bool answer_valid_ = false;
};

// What a client got of an answer that did not reach it (its deadline passed, it cancelled, or the
// connection broke): DEADLINE_EXCEEDED once `deadline` has passed, CANCELLED before. A unary call and
// each request of a stream are recorded with it.
absl::Status NotDelivered(absl::Time deadline);

// The value of the call's `authorization` metadata ("Bearer KEY"), "" when it has none,
// kRepeatedAuthorization when it has more than one, kOversizedMetadata when its metadata is over
// `calls`' max_metadata_bytes (Calls::Authorize refuses both).
absl::string_view Authorization(const grpc::CallbackServerContext* ctx, const Calls& calls);

// A refusal for a rate limit says when to retry: as gRPC's grpc-retry-pushback-ms trailing metadata,
// which a channel's retry policy waits for.
void AddRetryPushback(grpc::CallbackServerContext* ctx, const absl::Status& status);

// The call's deadline as gRPC gives it, in wall time (InfiniteFuture when it has none).
absl::Time Deadline(const grpc::CallbackServerContext* ctx);

// What an API makes of one call: the plan (infer_steps.h), and how its message is made of the core's
// answer (a non-OK status refuses the answer).
template <typename Message>
struct PlannedCall : Planned {
  std::function<absl::Status(const InferenceResponse&, Message*)> build;
};

// A gRPC call as PlanAndSubmit's steps (infer_steps.h). `Target` is an InferCall or a stream's request
// (infer_stream.h): call(), deadline(), is_cancelled(), Answer(status) and AnswerWith<Message>(answer, raw,
// build). `plan(raw, &call)` decodes and checks the request (it may set the call's model and request id as
// soon as it knows them, so that a refusal is recorded with them).
template <typename Message, typename Target, typename PlanFn>
struct GrpcSteps {
  Target* target;
  Core* core;
  const grpc::ByteBuffer* raw;
  grpc::ByteBuffer* raw_response;
  std::shared_ptr<PlanFn> plan;

  Call& call() { return target->call(); }
  absl::Time WaitDeadline() const { return MonotonicDeadline(core->env(), target->deadline()); }
  absl::StatusOr<PlannedCall<Message>> Plan() { return (*plan)(*raw, &target->call()); }
  // The request id, and the deadline: the sooner of gRPC's and the plan's timeout.
  absl::Status Prepare(InferenceRequest& r, absl::Duration timeout) {
    r.is_cancelled = target->is_cancelled();
    return target->call().Prepare(r, target->call().request_id(), WaitDeadline(), timeout);
  }
  void Fail(const absl::Status& status) { target->Answer(status); }
  Core::Done Answerer(PlannedCall<Message>&& planned) {
    return [target = target, raw_response = raw_response,
            build = std::move(planned.build)](absl::StatusOr<InferenceResponse> out) {
      target->template AnswerWith<Message>(out, raw_response, build);
    };
  }
};

template <typename Message, typename Target, typename Plan>
void PlanInferCall(Target* call, Core* core, const grpc::ByteBuffer* raw, grpc::ByteBuffer* raw_response,
                   std::shared_ptr<Plan> plan) {
  PlanAndSubmit(core, GrpcSteps<Message, Target, Plan>{call, core, raw, raw_response, std::move(plan)});
}

// Starts one inference call: admission (the caller's API key, then the request's bytes); then `plan(raw, call)`, which
// decodes and checks the request and returns a PlannedCall<Message> or the error to answer (it may set the call's model
// and request id as soon as it knows them, so that a refusal is recorded with them); then Prepare (request id,
// deadline: the sooner of gRPC's and the plan's timeout), cancellation, and Submit. The call answers exactly once,
// whatever fails.
template <typename Message, typename Plan>
grpc::ServerUnaryReactor* StartInferCall(Calls* calls, Core* core, const char* method, grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* raw, grpc::ByteBuffer* raw_response, Plan&& plan) {
  auto* call = new InferCall(calls, ctx, method, static_cast<int64_t>(raw->Length()));
  if (absl::Status admitted = call->call().Admission(Authorization(ctx, *calls)); !admitted.ok()) {
    call->Answer(admitted);
    return call;
  }
  PlanInferCall<Message>(call, core, raw, raw_response, std::make_shared<std::decay_t<Plan>>(std::forward<Plan>(plan)));
  return call;
}

// Answers `target` (an InferCall, a stream's request) with the core's answer, or its error: `build(answer,
// &message)` fills the API's message (a non-OK status refuses it), which is serialised into `raw`.
template <typename Message, typename Target, typename Build>
void AnswerWithMessage(Target* target, Call& call, const absl::StatusOr<InferenceResponse>& answer,
                       grpc::ByteBuffer* raw, Build&& build) {
  if (!answer.ok()) return target->Answer(answer.status());
  AnswerSummary summary;
  const absl::Status status = call.BuildAnswer(
      *answer,
      [&]() -> absl::StatusOr<int64_t> {
        Message message;
        if (absl::Status built = build(*answer, &message); !built.ok()) return built;
        bool own = false;
        if (grpc::Status s = grpc::SerializationTraits<Message>::Serialize(message, raw, &own); !s.ok()) {
          return FromGrpcStatus(s);
        }
        return static_cast<int64_t>(raw->Length());
      },
      &summary);
  if (!status.ok()) raw->Clear();
  target->Answer(status, status.ok() ? &summary : nullptr);
}

template <typename Message, typename Build>
void InferCall::AnswerWith(const absl::StatusOr<InferenceResponse>& answer, grpc::ByteBuffer* raw, Build&& build) {
  AnswerWithMessage<Message>(this, call_, answer, raw, std::forward<Build>(build));
}

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_INFER_CALL_H_

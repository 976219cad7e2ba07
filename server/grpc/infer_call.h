// A gRPC inference call (qvi.serving.v1's Classify and Tag, OIP's ModelInfer) as a reactor around the
// protocol-neutral Call (server/frontend/call.h): gRPC's deadline, cancellation, peer and
// `traceparent` metadata in, the serialised answer and its status out.
//
// StartInferCall() is the skeleton both gRPC APIs share: admission, the API's own decoding and
// planning, Prepare, Submit, and the catch that keeps a failure (std::bad_alloc, say) to its own call.
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
  // What PlanInferCall asks of a call (an InferCall, or one request of a stream, infer_stream.h): the
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

// What an API makes of one call once it has decoded and checked it.
template <typename Message>
struct PlannedCall {
  Method method = Method::kClassify;
  InferenceRequest request;  // request_id: the client's, or empty for one made up here
  // The version the plan was checked against (OIP reads its manifest to plan the tensors): the
  // core answers from it. Null: the core resolves the request's model and version, once.
  ServableHandle servable;
  absl::Duration timeout = absl::InfiniteDuration();  // the API's own timeout, beside gRPC's deadline
  // Fills the API's message from the core's answer; a non-OK status refuses the answer.
  std::function<absl::Status(const InferenceResponse&, Message*)> build;
};

// After admission: plan, Prepare, Submit. A plan that resolved a model which loads on demand waits
// for it (once, within gRPC's deadline) and plans again on the thread that loaded it.
// `Target` is an InferCall or a stream's request (infer_stream.h): call(), deadline(), is_cancelled(),
// Answer(status) and AnswerWith<Message>(answer, raw, build).
template <typename Message, typename Target, typename Plan>
void PlanInferCall(Target* call, Core* core, const grpc::ByteBuffer* raw, grpc::ByteBuffer* raw_response,
                   std::shared_ptr<Plan> plan, bool waited) {
  try {
    absl::StatusOr<PlannedCall<Message>> planned = (*plan)(*raw, &call->call());
    // Waits once -- or again, when the version a load handed over is not the one the request asks for
    // (another version of the model is still loading): each wait ends with a load, or at the deadline.
    if (!planned.ok() && (!waited || call->call().loaded != nullptr) && WaitsForLoad(planned.status())) {
      core->WhenLoaded(call->call().model, MonotonicDeadline(core->env(), call->deadline()),
                       [call, core, raw, raw_response, plan](absl::StatusOr<ServableHandle> loaded) {
                         if (!loaded.ok()) return call->Answer(loaded.status());
                         call->call().loaded = *std::move(loaded);
                         PlanInferCall<Message>(call, core, raw, raw_response, plan, /*waited=*/true);
                       });
      return;
    }
    if (!planned.ok()) return call->Answer(planned.status());
    InferenceRequest& r = planned->request;
    if (planned->servable == nullptr) planned->servable = Serving(call->call().loaded, r.model, r.version);
    call->call().loaded = nullptr;  // the request holds it from here
    if (absl::Status s = call->call().Prepare(r, call->call().request_id(),
                                              MonotonicDeadline(core->env(), call->deadline()), planned->timeout);
        !s.ok()) {
      return call->Answer(s);
    }
    r.is_cancelled = call->is_cancelled();
    core->Submit(
        planned->method, std::move(r),
        [call, raw_response, build = std::move(planned->build)](absl::StatusOr<InferenceResponse> out) {
          call->template AnswerWith<Message>(out, raw_response, build);
        },
        std::move(planned->servable));
  } catch (...) {  // bad_alloc decoding or planning: this call fails, the server goes on
    call->Answer(absl::InternalError(absl::StrCat("accepting the request failed: ", CurrentExceptionText())));
  }
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
  PlanInferCall<Message>(call, core, raw, raw_response, std::make_shared<std::decay_t<Plan>>(std::forward<Plan>(plan)),
                         /*waited=*/false);
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

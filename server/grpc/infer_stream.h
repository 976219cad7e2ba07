// A streaming inference call (qvi.serving.v1's ClassifyStream and TagStream): a bidirectional gRPC
// stream whose every message is one request, answered as soon as it is done (not in order) with its
// position in the stream and its request id. Each request is a Call of its own (server/frontend/call.h)
// planned, admitted, prepared and submitted exactly like a unary one (PlanInferCall, infer_call.h), so
// it meets the same limits, API keys, rate limits, deadline (the stream's) and cancellation, and is
// counted and logged once its answer was written (or could not be). A request's failure is its
// answer's `error`; the stream goes on.
//
// Flow control: at most `max_inflight` requests of a stream are read and not yet answered on the wire.
// The stream reads its next message only below that, so a client that stops reading its answers stops
// being read (gRPC's window then holds the client), and what one stream holds is bounded by
// max_inflight requests and their answers. gRPC allows one write at a time: answers wait in a queue
// (at most max_inflight of them) for their turn.
//
// Two kinds of stream, by the answer's message: one with `index`, `request_id` and `error` (qvi.serving.v1's
// ClassifyStreamResponse, TagStreamResponse) is answered as above. One without (TEI's PredictResponse,
// EncodeResponse, DecodeResponse: tei.v1's PredictStream, TokenizeStream, DecodeStream) is answered as TEI
// answers it: in the order the requests came, and the first request that fails ends the stream with its
// status (the requests after it are cancelled; what was answered before it was written).
// A request is answered by the core (Options::plan) or, for work the core has no part in (tokenizing),
// on the stream's own thread as it is read (Options::answer).
//
// Lifetime: the reactor lives until gRPC is done with it (OnDone) *and* the core has answered every
// request it took (the core answers each exactly once, cancelled or not); whichever comes last deletes
// it. After OnDone the context is gone, so requests read the stream's cancellation from a flag of
// their own and their deadline from when they were read.
#ifndef QVI_SERVER_GRPC_INFER_STREAM_H_
#define QVI_SERVER_GRPC_INFER_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "server/auth/rate_limit.h"
#include "server/core/base/sync.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/grpc/infer_call.h"
#include "server/grpc/status.h"

namespace qvi {

// The default of --max-stream-inflight.
inline constexpr int kDefaultMaxStreamInflight = 64;

// Whether a stream's answer message carries a request's error of its own (infer_stream.h's first kind).
template <typename Message, typename = void>
struct HasStreamError : std::false_type {};
template <typename Message>
struct HasStreamError<Message, std::void_t<decltype(std::declval<Message&>().mutable_error())>> : std::true_type {};

template <typename StreamResponse>
class InferStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Decodes and plans the stream's request number `index` (its position, from 0): the unary call's
  // plan, with an answer that is a StreamResponse.
  using Plan =
      std::function<absl::StatusOr<PlannedCall<StreamResponse>>(const grpc::ByteBuffer&, Call*, int64_t index)>;
  // Answers request `bytes` at once into `response` (serialised), within `deadline`: the status is its answer.
  using AnswerNow = std::function<absl::Status(const grpc::ByteBuffer& bytes, Call*, absl::Time deadline,
                                               grpc::ByteBuffer* response)>;
  struct Options {
    Core* core = nullptr;
    Calls* calls = nullptr;
    const char* method = "";  // the metrics' and the access log's name of each request's call
    int max_inflight = kDefaultMaxStreamInflight;
    Plan plan;         // a request the core answers
    AnswerNow answer;  // or, when set, one answered as it is read
  };
  // Answers in the order read; the first error ends the stream (TEI's streams).
  static constexpr bool kInOrder = !HasStreamError<StreamResponse>::value;

  // Refuses the stream at once when the caller's key cannot call inference (UNAUTHENTICATED,
  // PERMISSION_DENIED; rate limits are per request); else starts reading.
  InferStream(Options options, grpc::CallbackServerContext* ctx);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Item;
  // What to do once the lock is released: gRPC's operations are started outside it.
  struct Step {
    grpc::ByteBuffer* write = nullptr;
    bool read = false;
    bool finish = false;
    Item* failed = nullptr;    // kInOrder: the request whose error ends the stream (Finish sends it)
    std::deque<Item*> unsent;  // kInOrder: the answers after it, retired unwritten
  };

  // Item's answer is serialised in its `response`: queue it for writing (or retire it when the stream
  // cannot be written to any more).
  void Deliver(Item* item);
  // Every answer waiting to be written, taken out of the queues.
  std::deque<Item*> TakeUnsentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next write, the next read, or the end of the stream, as far as the state allows.
  Step NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Take(const Step& step);
  // Finish, after which no read is started: a read planned under mu_ before the stream ended (kInOrder ends it
  // from any thread, a read outstanding or not) is dropped rather than started after Finish. Touches nothing
  // of the stream after Finish.
  void FinishOnce(const grpc::Status& status);
  // Counts and logs `item` (`written`: its answer reached gRPC) and forgets it. Deletes the stream
  // when it was the last thing keeping it.
  void Retire(Item* item, bool written);

  const Options options_;
  grpc::CallbackServerContext* const ctx_;  // valid until OnDone
  std::atomic<bool> cancelled_{false};      // read by the requests in the core
  grpc::ByteBuffer read_;                   // the message being read (one read at a time)
  int64_t next_index_ = 0;                  // touched only by OnReadDone (one read at a time)

  Mutex mu_;
  std::deque<Item*> ready_ ABSL_GUARDED_BY(mu_);  // answered, waiting for their write
  // kInOrder: answered before an earlier request, by index; and the index whose answer is written next.
  std::map<int64_t, Item*> early_ ABSL_GUARDED_BY(mu_);
  int64_t next_write_ ABSL_GUARDED_BY(mu_) = 0;
  Item* writing_ ABSL_GUARDED_BY(mu_) = nullptr;
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;  // read and not yet retired
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool read_closed_ ABSL_GUARDED_BY(mu_) = false;  // the client half-closed, or the stream broke
  bool finished_ ABSL_GUARDED_BY(mu_) = false;     // Finish was called
  bool done_ ABSL_GUARDED_BY(mu_) = false;         // OnDone ran
  Mutex start_mu_;  // orders StartRead against Finish; never held with mu_, nor across Finish
  bool finish_called_ ABSL_GUARDED_BY(start_mu_) = false;
};

// One request of a stream, from its message to its answer's write: what GrpcSteps (infer_call.h) and
// AnswerWithMessage ask of a call.
template <typename StreamResponse>
class InferStream<StreamResponse>::Item {
 public:
  Item(InferStream* stream, int64_t index, grpc::ByteBuffer* request)
      : stream_(stream),
        index_(index),
        deadline_(Deadline(stream->ctx_)),
        call_(stream->options_.calls, stream->options_.method, static_cast<int64_t>(request->Length())) {
    request_.Swap(request);
    if (call_.wants_origin()) {  // each request a span of its own, a child of the stream's traceparent
      const auto& metadata = stream->ctx_->client_metadata();
      const auto header = metadata.find("traceparent");
      call_.SetOrigin(stream->ctx_->peer(), header == metadata.end()
                                                ? std::string_view()
                                                : std::string_view(header->second.data(), header->second.size()));
    }
  }

  Call& call() { return call_; }
  int64_t index() const { return index_; }
  const absl::Status& status() const { return status_; }
  absl::Time deadline() const { return deadline_; }
  std::function<bool()> is_cancelled() const {
    return [flag = &stream_->cancelled_] { return flag->load(std::memory_order_relaxed); };
  }

  // Answers once (a second answer is ignored): an error becomes the answer's `error`.
  void Answer(const absl::Status& status, const AnswerSummary* answer = nullptr) {
    if (!call_.Claim()) return;
    status_ = status;
    if (answer != nullptr) summary_ = *answer;
    has_summary_ = answer != nullptr;
    if constexpr (!kInOrder) {
      if (!status.ok()) SerializeError(status);
    }
    stream_->Deliver(this);
  }
  template <typename Message, typename Build>
  void AnswerWith(const absl::StatusOr<InferenceResponse>& answer, grpc::ByteBuffer* raw, Build&& build) {
    AnswerWithMessage<Message>(this, call_, answer, raw, std::forward<Build>(build));
  }

  const grpc::ByteBuffer* request() const { return &request_; }
  grpc::ByteBuffer* response() { return &response_; }

  // Counts and logs the request with what its client got.
  void Record(bool written) const {
    const absl::Status seen = written ? status_ : NotDelivered(deadline_);
    call_.Record(seen, has_summary_ && seen.ok() ? &summary_ : nullptr);
  }

 private:
  template <typename Message = StreamResponse>
  void SerializeError(const absl::Status& status) {
    Message message;
    message.set_index(index_);
    message.set_request_id(call_.request_id());
    auto* error = message.mutable_error();
    error->set_code(static_cast<int32_t>(status.code()));
    error->set_message(std::string(status.message()));
    if (std::optional<absl::Duration> after = RetryAfter(status)) {
      error->set_retry_after_ms(absl::ToInt64Milliseconds(*after));
    }
    response_.Clear();
    bool own = false;
    (void)grpc::SerializationTraits<Message>::Serialize(message, &response_, &own);
  }

  InferStream* const stream_;
  const int64_t index_;
  const absl::Time deadline_;
  Call call_;
  grpc::ByteBuffer request_, response_;
  // Written by Answer() before Deliver(); read by Record() after the write.
  absl::Status status_;
  AnswerSummary summary_;
  bool has_summary_ = false;
};

}  // namespace qvi

#include "server/grpc/infer_stream_inl.h"  // the member functions' definitions

#endif  // QVI_SERVER_GRPC_INFER_STREAM_H_

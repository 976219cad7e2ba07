// The protocol-neutral half of an inference call, written once for every front end (native gRPC,
// OIP gRPC, HTTP/JSON, KServe REST): the memory admitted by request bytes, the request id, the trace,
// the deadline, the answer-size limit, the one answer, the release of what the call held, and the
// counting of the call once it is over (metrics, access log).
//
// A front end is a thin adapter around a Call: it decodes its protocol's request, hands the Call's
// Prepare()d InferenceRequest to the core, builds its protocol's answer through BuildAnswer() (which
// times it, catches what it throws and checks its size), and delivers the answer once Claim() says it
// is the first. Record() counts the call with the status its client really got: over gRPC that is
// known only when gRPC says the call is over (an answer cut by a deadline or a cancellation counts as
// DEADLINE_EXCEEDED or CANCELLED, never as OK), over HTTP when the answer is handed to the connection.
//
// A new per-call policy (an API key, a rate limit, a priority, a cache look-up) belongs here, once.
#ifndef QVI_SERVER_FRONTEND_CALL_H_
#define QVI_SERVER_FRONTEND_CALL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/auth/api_keys.h"
#include "server/core/base/env.h"
#include "server/core/base/exception_text.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request.h"
#include "server/frontend/decision_log.h"
#include "server/metrics/metrics.h"
#include "server/tracing/span.h"
#include "server/tracing/trace_context.h"

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
  int64_t bytes = 0;  // the answer as serialised
  // options.abstain_below (the request's, or its model's default): `judges`, and the answers judged (texts,
  // or entities) and those marked abstained.
  bool judges = false;
  int64_t judged = 0, abstained = 0;
};

// A call's trace (trace_context.h): its trace id ("" for none) and whether its timings are logged.
struct CallTrace {
  std::string trace_id;
  bool traced = false;
};

// "OK", "INVALID_ARGUMENT", ...: the metrics' and the access log's name of a code (gRPC's and absl's
// codes are the same numbers and names).
std::string StatusCodeName(absl::StatusCode code);

// What every call of the server shares: the limits, the request-id counter, the bytes in flight over
// every protocol, the trace draw, and where finished calls are counted.
class Call;

class Calls {
 public:
  struct Options {
    bool access_log = false;
    Metrics* metrics = nullptr;  // may be null
    // Bytes of inference requests received and not yet answered, with their answers' estimated sizes,
    // at most, over every protocol. A call whose request would go over is refused at once with
    // RESOURCE_EXHAUSTED, before it is parsed; one whose answer would, once its answer is estimated,
    // before it is queued. 0: no limit.
    int64_t max_inflight_request_bytes = 0;
    // The largest answer sent (the server's send limit, --max-message-bytes). 0: no limit.
    int64_t max_response_bytes = 0;
    // The share of calls without a traceparent whose timings the access log gets (--trace-rate).
    double trace_rate = 0;
    // The API keys every call but the probes must present (--api-keys); null: no key is asked for.
    const ApiKeys* api_keys = nullptr;
    // Where the spans of calls whose trace is exported go (--otlp-endpoint); null: none are made.
    SpanSink* spans = nullptr;
    // The share of calls without a traceparent whose trace is exported (--otlp-sampling-ratio); a
    // call with one follows its sampled flag.
    double span_ratio = 1.0;
    // A gRPC call's metadata, at most, as HPACK counts it (each entry's key and value, and 32): a call
    // over it is refused alone (the transport's own limit, far above it, resets its connection).
    // 0: no limit but the transport's.
    int64_t max_metadata_bytes = 0;
    // Where a sampled record of each call's decision goes (--decision-log); null: none is kept.
    DecisionLog* decisions = nullptr;
  };

  Calls(const ModelRepository* repository, Options options);

  const Options& options() const { return options_; }
  const Env& env() const { return *repository_->env(); }

  // "req-N", for calls that brought no id of their own.
  std::string NextRequestId();

  // A call's trace when the access log is on: the trace id of its valid `traceparent` header (traced),
  // else the draw of --trace-rate. Empty when the access log is off.
  CallTrace TraceOf(std::string_view traceparent) const;

  // Whether `authorization` (the header's value, "" when absent) carries a key with `scope`: always
  // OK without --api-keys; else UNAUTHENTICATED or PERMISSION_DENIED (api_keys.h), or
  // RESOURCE_EXHAUSTED when the key is over its requests-per-second limit (rate_limit.h; the status
  // says when to retry). `key` gets the key whenever it was valid, refused or not. With `count_refusal`,
  // a refusal is counted for the key (the metrics' qvi_key_requests_total; inference calls are counted
  // by Record instead, whatever their end).
  absl::Status Authorize(absl::string_view authorization, Scope scope, std::shared_ptr<const ApiKey>* key = nullptr,
                         bool count_refusal = true) const;

  // RESOURCE_EXHAUSTED, the one message every protocol answers, when an answer of `bytes` (exact, or
  // at least that many) is over the send limit (--max-message-bytes); OK otherwise.
  absl::Status CheckAnswerSize(int64_t bytes) const;

 private:
  friend class Call;
  // Counts and logs one finished call (Call::Record): the access line, the call's metrics.
  void Record(const Call& call, const absl::Status& status, const AnswerSummary* answer) const;
  // RESOURCE_EXHAUSTED when `held` bytes in flight, `answer_bytes` of them an answer's estimate, are
  // over --max-inflight-request-bytes.
  absl::Status CheckHeld(int64_t held, int64_t answer_bytes) const;
  // The spans of a finished call whose trace is exported (call_spans.cc).
  void ExportSpans(const Call& call, const absl::Status& status, const AnswerSummary* answer) const;

  const ModelRepository* repository_;
  const Options options_;
  const Tracer tracer_;
  const SpanSampler sampler_;
  mutable RateLimiter limiter_;  // the keys' buckets (with --api-keys)
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> inflight_bytes_{0};
};

// One inference call, from its arrival to its one answer. The front end owns it (a gRPC reactor, an
// HTTP call object) and keeps it alive until the call is recorded.
class Call {
 public:
  // Counts the call as started and its request's bytes as held.
  Call(Calls* calls, const char* method, int64_t request_bytes);
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // Whether the access log, the span export or the decision log wants the caller's address and trace (SetOrigin): a
  // front end need not look them up otherwise.
  bool wants_origin() const {
    return calls_->options_.access_log || calls_->options_.spans != nullptr || calls_->options_.decisions != nullptr;
  }
  void SetOrigin(std::string peer, std::string_view traceparent);

  // The checks before anything of the request is parsed: the caller's API key (`authorization`, the
  // header's value; with --api-keys it must have the `infer` scope), then RESOURCE_EXHAUSTED when this
  // call's bytes took the bytes in flight over the limit. Answer what it returns when not OK.
  absl::Status Admission(absl::string_view authorization);

  // What every protocol does once its request is decoded and checked: the request id (the request's
  // own, else `fallback_id`, else one made up), the model and text count the call is recorded with,
  // the deadline (the sooner of `deadline`, a time of the core's clock, and `timeout` from the call's
  // arrival), and the hook that holds the answer's estimated bytes (HoldAnswer). `owner`, when given,
  // is kept alive by that hook (an HTTP call owned by a shared_ptr).
  // With --api-keys, the request's priority (r.priority: its own, else its key's default; KeyPriority
  // refuses one above the key's max_priority). RESOURCE_EXHAUSTED when the caller's key is over its
  // texts-per-second limit (rate_limit.h). Answer what it returns when not OK, before anything is
  // tokenised.
  absl::Status Prepare(InferenceRequest& r, std::string_view fallback_id, absl::Time deadline,
                       absl::Duration timeout = absl::InfiniteDuration(), std::shared_ptr<void> owner = nullptr);

  // Counts the answer's estimated bytes as held with the request's until the call is answered;
  // RESOURCE_EXHAUSTED when they take the bytes in flight over the limit. Only the first call holds.
  absl::Status HoldAnswer(int64_t answer_bytes);

  // Builds the protocol's answer to the core's `answer`: `build()` returns the answer's size in bytes
  // (or why there is none); the size is checked against the send limit, and a failure while building
  // (std::bad_alloc, say) is INTERNAL for this call alone. On success fills `summary`, the build's
  // time included. Nothing thrown leaves it.
  template <typename Build>
  absl::Status BuildAnswer(const InferenceResponse& answer, Build&& build, AnswerSummary* summary) const;

  // True exactly once, for whoever answers the call; from then on the bytes it held no longer count:
  // a client that has its answer (a refusal included) may send the next request at once.
  bool Claim();

  // Counts and logs the call with the status its client got; never throws.
  void Record(const absl::Status& seen, const AnswerSummary* answer) const;

  absl::Time start() const { return start_; }
  // Charges an answer's tokens to the caller's key (its tokens-per-second limit, rate_limit.h).
  void ChargeTokens(int64_t tokens) const;
  const std::string& request_id() const { return request_id_; }
  // An id known before Prepare (OIP's, read while planning), so that a refusal is recorded with it.
  void set_request_id(std::string id) { request_id_ = std::move(id); }
  const char* method() const { return method_; }

  // Set while the call is prepared (the model as soon as it is known, so that a refusal is recorded
  // with it).
  std::string model;
  // The version a load on demand made READY for this call (ModelRepository::WhenLoaded), held: its
  // plan serves the call by it (Serving()) rather than resolving again. Null until then.
  ServableHandle loaded;
  // When the call first began and last ended waiting for a load on demand (PlanAndSubmit), on the
  // core's clock: its trace shows the wait (qvi.load_wait). InfiniteFuture: it did not wait (or, for the
  // end, is still waiting).
  absl::Time load_wait_start = absl::InfiniteFuture();
  absl::Time load_wait_end = absl::InfiniteFuture();

 private:
  friend class Calls;  // Record reads what the call gathered
  Calls* const calls_;
  const char* const method_;
  const absl::Time start_;
  const int64_t bytes_;
  int64_t held_ = 0;                      // the bytes in flight with this call's
  std::atomic<int64_t> answer_bytes_{0};  // the answer's estimate, held since HoldAnswer
  std::atomic<bool> answered_{false};
  std::string peer_;
  CallTrace trace_;  // set when the access log is on
  // The call's span when its trace is exported (SetOrigin decides): its ids and its caller's span.
  struct ExportedSpan {
    bool sampled = false;
    TraceId trace_id{};
    SpanId span_id{};
    std::optional<SpanId> parent;
  } span_;
  std::shared_ptr<const ApiKey> key_;  // the caller's key, once Admission found it valid (refused or not)
  std::string request_id_;
  int64_t texts_ = 0;
  Priority priority_ = Priority::kDefault;  // the request's, once Prepare resolved it
  std::string explain_ = "none";            // the explanations it asked for (ExplainLabel), once prepared
  // Sampled for the decision log (Prepare): its texts' SHA-256 (and, with --decision-log-texts, the texts).
  std::vector<std::string> decision_sha256_, decision_texts_;
  // Queues the call's line in the decision log (decision_log.h); throws nothing.
  void LogDecision(const InferenceResponse& answer) const;
  void LogDecisionOrThrow(const InferenceResponse& answer) const;
};

// options.abstain_below's counts of an answer (AnswerSummary::judged, abstained): a classifier's texts, a
// tagger's entities.
void CountAbstentions(const InferenceResponse& answer, AnswerSummary* summary);

// The explanations `options` asks for, as a metrics label: "none", or their names joined by '+' in
// a fixed order ("attention+gates"): at most one series per combination in use.
std::string ExplainLabel(const OutputOptions& options);

template <typename Build>
absl::Status Call::BuildAnswer(const InferenceResponse& answer, Build&& build, AnswerSummary* summary) const {
  const Env& env = calls_->env();
  const absl::Time building = env.Now();
  absl::Status status;
  absl::StatusOr<int64_t> bytes = 0;
  try {
    bytes = build();
    status = bytes.ok() ? calls_->CheckAnswerSize(*bytes) : bytes.status();
  } catch (...) {
    status = absl::InternalError(absl::StrCat("building the answer failed: ", CurrentExceptionText()));
  }
  if (status.ok()) {
    ChargeTokens(answer.tokens);  // before the answer leaves: the caller's next call sees the charge
    *summary = AnswerSummary{answer.version,          answer.tokens,        answer.queue_time,
                             answer.compute_time,     answer.queued_at,     answer.forward_time,
                             answer.postprocess_time, env.Now() - building, *bytes};
    if (answer.abstain_below) CountAbstentions(answer, summary);
    if (!decision_sha256_.empty()) LogDecision(answer);
  }
  return status;
}

}  // namespace qvi

#endif  // QVI_SERVER_FRONTEND_CALL_H_

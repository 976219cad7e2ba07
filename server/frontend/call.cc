#include "server/frontend/call.h"
#include "server/core/base/exception_text.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "server/core/request/request_checks.h"
#include "server/core/serving/shadow.h"
#include "server/logging.h"

namespace qvi {

std::string StatusCodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

Calls::Calls(const ModelRepository* repository, Options options)
    : repository_(repository),
      options_(options),
      tracer_(options.trace_rate),
      sampler_(options.span_ratio),
      limiter_([metrics = options.metrics](const std::string& key, absl::string_view limit) {
        if (metrics != nullptr) metrics->OnKeyLimited(key, std::string(limit));
      }) {}

std::string Calls::NextRequestId() { return absl::StrCat("req-", next_id_.fetch_add(1)); }

CallTrace Calls::TraceOf(std::string_view traceparent) const {
  CallTrace trace;
  if (!options_.access_log && options_.decisions == nullptr) return trace;
  // A caller's valid traceparent traces the call under its trace id; otherwise the draw decides (the access log's:
  // the decision log names the caller's trace alone).
  if (std::optional<TraceParent> parent = ParseTraceParent(traceparent)) return CallTrace{parent->trace_id, true};
  if (!options_.access_log) return trace;
  trace.trace_id = tracer_.Draw();
  trace.traced = !trace.trace_id.empty();
  return trace;
}

absl::Status Calls::Authorize(absl::string_view authorization, Scope scope, std::shared_ptr<const ApiKey>* key,
                              bool count_refusal) const {
  if (authorization == kOversizedMetadata) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the call's metadata is over the limit of ", options_.max_metadata_bytes,
                     " bytes (--max-metadata-bytes; each entry counts its key, its value and 32); send less"));
  }
  if (options_.api_keys == nullptr) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<const ApiKey>> found = options_.api_keys->Find(authorization);
  absl::Status s = found.ok() ? ApiKeys::CheckScope(**found, scope) : found.status();
  if (s.ok()) s = limiter_.TakeRequest((*found)->bucket(), env().Now());
  if (found.ok() && key != nullptr) *key = *found;  // a valid key, even one refused: the log names it
  // Counted under the key's name when it was valid (it lacked the scope, or was over a limit), else
  // under "_none".
  if (!s.ok() && count_refusal && options_.metrics != nullptr) {
    options_.metrics->OnKeyRequest(found.ok() ? (*found)->name : "_none", StatusCodeName(s.code()));
  }
  return s;
}

absl::Status Calls::CheckAnswerSize(int64_t bytes) const {
  const int64_t limit = options_.max_response_bytes;
  if (limit <= 0 || bytes <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("the answer is ", bytes, " bytes, over the limit of ", limit,
                                                   " bytes (--max-message-bytes); ask for fewer texts or outputs"));
}

absl::Status Calls::CheckHeld(int64_t held, int64_t answer_bytes) const {
  const int64_t limit = options_.max_inflight_request_bytes;
  if (limit <= 0 || held <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      answer_bytes > 0 ? absl::StrCat("requests in flight and their answers would hold ", held,
                                      " bytes (this answer about ", answer_bytes, "), over the limit of ", limit,
                                      " bytes (--max-inflight-request-bytes); retry with backoff")
                       : absl::StrCat("requests in flight would hold ", held, " bytes, over the limit of ", limit,
                                      " bytes (--max-inflight-request-bytes); retry with backoff"));
}

std::string ExplainLabel(const OutputOptions& options) {
  static constexpr std::pair<OutputSwitch, const char*> kKinds[] = {{OutputSwitch::kTokens, "tokens"},
                                                                    {OutputSwitch::kAttention, "attention"},
                                                                    {OutputSwitch::kGates, "gates"},
                                                                    {OutputSwitch::kLayerGates, "layer_gates"},
                                                                    {OutputSwitch::kLayerAttention, "layer_attention"},
                                                                    {OutputSwitch::kContributions, "contributions"},
                                                                    {OutputSwitch::kOcclusion, "occlusion"},
                                                                    {OutputSwitch::kFaithfulness, "faithfulness"}};
  std::string label;
  for (const auto& [kind, name] : kKinds) {
    if (options.Asks(kind)) absl::StrAppend(&label, label.empty() ? "" : "+", name);
  }
  return label.empty() ? "none" : label;
}

void Calls::Record(const Call& call, const absl::Status& status, const AnswerSummary* answer) const {
  const char* method = call.method_;
  const std::string& model = call.model;
  const std::string& request_id = call.request_id_;
  const CallTrace& trace = call.trace_;
  const ApiKey* key = call.key_.get();
  const absl::Duration latency = repository_->env()->Now() - call.start_;
  const int64_t version = answer != nullptr ? answer->version : 0;
  const std::string code = StatusCodeName(status.code());
  if (options_.access_log) {
    AccessRecord a;
    a.method = method;
    a.peer = call.peer_;
    a.model = Capped(model);
    a.version = version;
    a.request_id = Capped(request_id);
    a.texts = call.texts_;
    a.code = static_cast<int>(status.code());
    a.code_name = code;
    a.ms = absl::ToDoubleMilliseconds(latency);
    a.trace_id = trace.trace_id;
    a.traced = trace.traced;
    if (options_.api_keys != nullptr) a.key = key != nullptr ? key->name : "_none";
    if (PriorityLevel(call.priority_) != PriorityLevel(Priority::kNormal)) {
      a.priority = std::string(PriorityName(call.priority_));
    }
    if (answer != nullptr) {
      a.tokens = answer->tokens;
      a.queue_ms = absl::ToDoubleMilliseconds(answer->queue);
      a.compute_ms = absl::ToDoubleMilliseconds(answer->compute);
      if (answer->queued_at != absl::InfiniteFuture()) {
        a.prepare_ms = absl::ToDoubleMilliseconds(answer->queued_at - call.start_);
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
    if (options_.api_keys != nullptr) options_.metrics->OnKeyRequest(key != nullptr ? key->name : "_none", code);
    if (answer != nullptr && status.ok()) {
      options_.metrics->OnAnswer(model, call.explain_, answer->bytes, answer->postprocess + answer->serialize);
      if (answer->judges) options_.metrics->OnAbstention(model, version, answer->judged, answer->abstained);
    }
  }
  if (call.span_.sampled && options_.spans != nullptr) ExportSpans(call, status, answer);
}

void CountAbstentions(const InferenceResponse& answer, AnswerSummary* summary) {
  summary->judges = true;
  for (const TextResult& r : answer.results) {
    if (!r.labels.empty()) {
      ++summary->judged;
      summary->abstained += r.abstained ? 1 : 0;
    }
    for (const SpanOutput& s : r.spans) {
      ++summary->judged;
      summary->abstained += s.abstained ? 1 : 0;
    }
  }
}

Call::Call(Calls* calls, const char* method, int64_t request_bytes)
    : calls_(calls), method_(method), start_(calls->env().Now()), bytes_(request_bytes) {
  if (calls_->options_.metrics != nullptr) calls_->options_.metrics->OnRequestStart();
  // Memory admitted by bytes: the request's bytes count against the limit until it is answered.
  held_ = calls_->inflight_bytes_.fetch_add(bytes_) + bytes_;
}

absl::Status Call::Admission(absl::string_view authorization) {
  // Counted once, by Record, like every call.
  if (absl::Status s = calls_->Authorize(authorization, Scope::kInfer, &key_, /*count_refusal=*/false); !s.ok()) {
    return s;
  }
  return calls_->CheckHeld(held_, 0);
}

void Call::SetOrigin(std::string peer, std::string_view traceparent) {
  peer_ = std::move(peer);
  trace_ = calls_->TraceOf(traceparent);
  if (calls_->options_.spans == nullptr) return;
  const std::optional<TraceParent> parent = ParseTraceParent(traceparent);
  span_.sampled = calls_->sampler_.Sample(parent ? std::optional<bool>(parent->sampled) : std::nullopt);
  if (!span_.sampled) return;
  // One trace id for the access line and the spans: the caller's, else the one the access log drew.
  std::optional<TraceId> id = parent ? TraceIdFromHex(parent->trace_id) : TraceIdFromHex(trace_.trace_id);
  span_.trace_id = id ? *id : NewTraceId();
  span_.span_id = NewSpanId();
  if (parent) span_.parent = SpanIdFromHex(parent->parent_id);
  if (calls_->options_.access_log && trace_.trace_id.empty()) trace_.trace_id = ToHex(span_.trace_id);
}

absl::Status Call::Prepare(InferenceRequest& r, std::string_view fallback_id, absl::Time deadline,
                           absl::Duration timeout, std::shared_ptr<void> owner) {
  if (r.request_id.empty()) r.request_id = fallback_id.empty() ? calls_->NextRequestId() : std::string(fallback_id);
  request_id_ = r.request_id;
  model = r.model;
  texts_ = static_cast<int64_t>(r.texts.size());
  r.deadline = std::min(r.deadline, deadline);
  if (timeout != absl::InfiniteDuration()) r.deadline = std::min(r.deadline, start_ + timeout);
  r.hold_answer_bytes = [this, owner = std::move(owner)](int64_t bytes) { return HoldAnswer(bytes); };
  if (key_) {
    absl::StatusOr<Priority> priority = KeyPriority(*key_, r.priority);
    if (!priority.ok()) return priority.status();
    r.priority = *priority;
  }
  priority_ = r.priority;
  explain_ = ExplainLabel(r.options);
  if (span_.sampled) r.span = SpanRef{span_.trace_id, span_.span_id};
  if (DecisionLog* log = calls_->options_.decisions; log != nullptr && log->Sample(model, key_ ? key_->name : "")) {
    decision_sha256_.clear();
    for (const std::string& text : r.texts) decision_sha256_.push_back(TextSha256(text));
    if (log->keeps_texts()) decision_texts_ = r.texts;
  }
  if (!key_) return absl::OkStatus();
  return calls_->limiter_.TakeTexts(key_->bucket(), texts_, start_);
}

void Call::LogDecision(const InferenceResponse& answer) const {
  try {
    LogDecisionOrThrow(answer);
  } catch (...) {  // (std::bad_alloc) the decision is not logged; the answer goes out as it is
  }
}

void Call::LogDecisionOrThrow(const InferenceResponse& answer) const {
  DecisionLog::Call c;
  c.answer = &answer;
  c.text_sha256 = decision_sha256_;
  c.texts = decision_texts_;
  c.key = key_ ? key_->name : "";
  c.request_id = request_id_;
  if (span_.sampled) {
    c.trace_id = ToHex(span_.trace_id);
  } else {
    c.trace_id = trace_.trace_id;
  }
  c.time = absl::Now();
  c.latency = calls_->env().Now() - start_;
  calls_->options_.decisions->Offer(c);
}

absl::Status Call::HoldAnswer(int64_t answer_bytes) {
  int64_t none = 0;
  if (answered_.load() || answer_bytes <= 0 || !answer_bytes_.compare_exchange_strong(none, answer_bytes)) {
    return absl::OkStatus();  // answered already, nothing to hold, or held once already
  }
  const int64_t held = calls_->inflight_bytes_.fetch_add(answer_bytes) + answer_bytes;
  return calls_->CheckHeld(held, answer_bytes);
}

bool Call::Claim() {
  if (answered_.exchange(true)) return false;
  // gRPC's own buffers until the call is over are bounded by its resource quota.
  calls_->inflight_bytes_.fetch_sub(bytes_ + answer_bytes_.load());
  return true;
}

void Call::ChargeTokens(int64_t tokens) const {
  if (key_) calls_->limiter_.ChargeTokens(key_->bucket(), tokens, calls_->env().Now());
}

void Call::Record(const absl::Status& seen, const AnswerSummary* answer) const {
  try {
    calls_->Record(*this, seen, answer);
  } catch (...) {
    spdlog::error("counting a finished {} call (request_id {}, trace_id {}) failed: {}", method_, Capped(request_id_),
                  trace_.trace_id.empty() ? "none" : trace_.trace_id, CurrentExceptionText());
  }
}

}  // namespace qvi

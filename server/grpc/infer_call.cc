#include "server/grpc/infer_call.h"

#include <chrono>
#include <iterator>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/auth/api_keys.h"
#include "server/auth/rate_limit.h"

namespace qvi {

absl::string_view Authorization(const grpc::CallbackServerContext* ctx, const Calls& calls) {
  const auto& metadata = ctx->client_metadata();
  if (const int64_t limit = calls.options().max_metadata_bytes; limit > 0) {
    int64_t bytes = 0;
    for (const auto& [key, value] : metadata) bytes += static_cast<int64_t>(key.size() + value.size()) + 32;
    if (bytes > limit) return kOversizedMetadata;
  }
  const auto [first, end] = metadata.equal_range("authorization");
  if (first == end) return absl::string_view();
  if (std::next(first) != end) return kRepeatedAuthorization;
  return absl::string_view(first->second.data(), first->second.size());
}

void AddRetryPushback(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  if (std::optional<absl::Duration> after = RetryAfter(status)) {
    ctx->AddTrailingMetadata("grpc-retry-pushback-ms", absl::StrCat(absl::ToInt64Milliseconds(*after)));
  }
}

absl::Time Deadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

InferCall::InferCall(Calls* calls, grpc::CallbackServerContext* ctx, const char* method, int64_t request_bytes)
    : ctx_(ctx), call_(calls, method, request_bytes) {
  if (call_.wants_origin()) {
    const auto& metadata = ctx->client_metadata();
    const auto header = metadata.find("traceparent");
    call_.SetOrigin(ctx->peer(), header == metadata.end()
                                     ? std::string_view()
                                     : std::string_view(header->second.data(), header->second.size()));
  }
}

absl::Time InferCall::deadline() const { return Deadline(ctx_); }

void InferCall::Answer(const absl::Status& status, const AnswerSummary* answer) {
  if (!call_.Claim()) return;
  status_ = status;
  if (answer != nullptr) answer_ = *answer;
  answer_valid_ = answer != nullptr;
  AddRetryPushback(ctx_, status);
  Finish(ToGrpcStatus(status));
}

absl::Status NotDelivered(absl::Time deadline) {
  return absl::Status(deadline <= absl::Now() ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kCancelled,
                      "the answer did not reach the client");
}

void InferCall::OnDone() {
  // A cancelled context: the client never got this status.
  const absl::Status seen = ctx_->IsCancelled() ? NotDelivered(Deadline(ctx_)) : status_;
  call_.Record(seen, answer_valid_ && seen.ok() ? &answer_ : nullptr);
  delete this;
}

}  // namespace qvi

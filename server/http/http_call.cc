#include "server/http/http_call.h"

#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/routes.h"

namespace qvi {
namespace {

// X-Request-Timeout-Ms: the call's deadline, in milliseconds from its arrival (as gRPC's grpc-timeout
// is for a gRPC call); absent: none.
absl::StatusOr<absl::Duration> RequestTimeout(absl::string_view header) {
  if (header.empty()) return absl::InfiniteDuration();
  constexpr int64_t kMaxMs = int64_t{24} * 3600 * 1000;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(header, &ms) || ms < 1 || ms > kMaxMs) {
    return absl::InvalidArgumentError(absl::StrCat("X-Request-Timeout-Ms: '", header.substr(0, 40),
                                                   "' is not a whole number of milliseconds from 1 to ", kMaxMs));
  }
  return absl::Milliseconds(ms);
}

}  // namespace

HttpCall::HttpCall(Calls* calls, const char* method, const HttpRequest& request, HttpServer::Reply reply)
    : call_(calls, method, static_cast<int64_t>(request.body.size())), reply_(std::move(reply)) {
  if (call_.wants_origin()) call_.SetOrigin(request.peer, request.Header("traceparent"));
}

absl::Status HttpCall::Prepare(InferenceRequest& r, const HttpRequest& request, int max_request_id_bytes,
                               absl::Duration timeout) {
  // The core checks the request id's length, and refuses one over the limit.
  absl::StatusOr<absl::Duration> header = RequestTimeout(request.Header("X-Request-Timeout-Ms"));
  const absl::Time deadline = HeaderDeadline(request);
  // X-Request-Priority: the priority of a request whose body names none (a gateway may set it).
  absl::Status priority;
  if (const std::string named = request.Header("X-Request-Priority");
      !named.empty() && r.priority == Priority::kDefault) {
    absl::StatusOr<Priority> p = ParsePriority(named, "X-Request-Priority");
    priority = p.status();
    if (p.ok()) r.priority = *p;
  }
  absl::Status limited = call_.Prepare(r, request.Header("X-Request-Id"), deadline, timeout, shared_from_this());
  echo_id_ = static_cast<int>(call_.request_id().size()) <= max_request_id_bytes;
  if (!header.ok()) return header.status();
  return priority.ok() ? limited : priority;
}

absl::Time HttpCall::HeaderDeadline(const HttpRequest& request) const {
  absl::StatusOr<absl::Duration> header = RequestTimeout(request.Header("X-Request-Timeout-Ms"));
  return header.ok() && *header != absl::InfiniteDuration() ? call_.start() + *header : absl::InfiniteFuture();
}

void HttpCall::Fail(const absl::Status& status) { Finish(status, error_form_(status), nullptr); }

void HttpCall::Finish(const absl::Status& status, HttpResponse response, const AnswerSummary* summary) {
  if (!call_.Claim()) return;
  call_.Record(status, status.ok() ? summary : nullptr);
  if (echo_id_ && !call_.request_id().empty()) response.headers.emplace_back("X-Request-Id", call_.request_id());
  reply_(std::move(response));
}

}  // namespace qvi

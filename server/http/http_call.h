// An inference call over HTTP (native Classify/Tag in JSON, KServe v2 REST's infer) as an adapter
// around the protocol-neutral Call (server/frontend/call.h): the peer, `traceparent`, X-Request-Id,
// X-Request-Timeout-Ms and X-Request-Priority headers in; the answer, its X-Request-Id and its HTTP status out. The
// call is recorded when its answer is handed to the connection.
#ifndef QVI_SERVER_HTTP_HTTP_CALL_H_
#define QVI_SERVER_HTTP_HTTP_CALL_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/request/request.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/frontend/infer_steps.h"
#include "server/http/http_server.h"
#include "server/http/routes.h"

namespace qvi {

class HttpCall : public std::enable_shared_from_this<HttpCall> {
 public:
  // Counts the call as started and the request's bytes as held.
  HttpCall(Calls* calls, const char* method, const HttpRequest& request, HttpServer::Reply reply);

  Call& call() { return call_; }

  // The deadline X-Request-Timeout-Ms sets, from the call's arrival (InfiniteFuture: none, or malformed).
  absl::Time HeaderDeadline(const HttpRequest& request) const;

  // Call::Prepare with HTTP's headers: the request id (the body's, else X-Request-Id's, else one made
  // up; echoed in the answer's X-Request-Id when within `max_request_id_bytes`), the deadline (the
  // sooner of X-Request-Timeout-Ms and `timeout`, both from the call's arrival), the priority (the
  // body's, else X-Request-Priority's: a name or 0 to 3). INVALID_ARGUMENT for a malformed
  // X-Request-Timeout-Ms or X-Request-Priority.
  absl::Status Prepare(InferenceRequest& r, const HttpRequest& request, int max_request_id_bytes,
                       absl::Duration timeout = absl::InfiniteDuration());

  // Answers with the error (once), in the route's form (ErrorResponse unless set_error_form chose another:
  // TEI's routes answer TEI's).
  void Fail(const absl::Status& status);
  void set_error_form(HttpResponse (*form)(const absl::Status&)) { error_form_ = form; }
  // Answers with `response` (once), OK: a call the core has no part in (TEI's /tokenize).
  void Answer(HttpResponse response) { Finish(absl::OkStatus(), std::move(response), nullptr); }

  // Answers with the core's answer, or its error: `build()` returns the HTTP answer (or why there is
  // none), timed, bounded by the send limit and kept from throwing by Call::BuildAnswer.
  template <typename Build>
  void AnswerWith(const absl::StatusOr<InferenceResponse>& answer, Build&& build);

 private:
  void Finish(const absl::Status& status, HttpResponse response, const AnswerSummary* summary);

  Call call_;
  HttpServer::Reply reply_;
  bool echo_id_ = false;  // the request id goes back in X-Request-Id
  HttpResponse (*error_form_)(const absl::Status&) = ErrorResponse;
};

// A call whose plan is the request its body decoded to (the native routes, TEI's), as PlanAndSubmit's steps
// (server/frontend/infer_steps.h): the core resolves its model (and waits, where it loads on demand) itself.
// `build(answer)` makes the HTTP answer (or says why there is none).
template <typename Build>
struct DecodedSteps {
  std::shared_ptr<HttpCall> http;
  Core* core;
  std::shared_ptr<const HttpRequest> request;
  Method method;
  std::shared_ptr<InferenceRequest> decoded;
  Build build;

  Call& call() { return http->call(); }
  absl::Time WaitDeadline() const { return http->HeaderDeadline(*request); }
  absl::StatusOr<Planned> Plan() {
    Planned planned;
    planned.method = method;
    planned.request = std::move(*decoded);
    return planned;
  }
  absl::Status Prepare(InferenceRequest& r, absl::Duration timeout) {
    return http->Prepare(r, *request, core->limits().max_request_id_bytes, timeout);
  }
  void Fail(const absl::Status& status) { http->Fail(status); }
  Core::Done Answerer(Planned&&) {
    return [call = http, build = build](absl::StatusOr<InferenceResponse> answer) {
      call->AnswerWith(answer, [&]() -> absl::StatusOr<HttpResponse> { return build(*answer); });
    };
  }
};

template <typename Build>
void HttpCall::AnswerWith(const absl::StatusOr<InferenceResponse>& answer, Build&& build) {
  if (!answer.ok()) return Fail(answer.status());
  HttpResponse response;
  AnswerSummary summary;
  const absl::Status status = call_.BuildAnswer(
      *answer,
      [&]() -> absl::StatusOr<int64_t> {
        absl::StatusOr<HttpResponse> built = build();
        if (!built.ok()) return built.status();
        response = *std::move(built);
        return static_cast<int64_t>(response.body.size());
      },
      &summary);
  if (!status.ok()) return Fail(status);
  Finish(status, std::move(response), &summary);
}

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_HTTP_CALL_H_

#include "server/http/kserve/kserve_routes.h"

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/frontend/infer_steps.h"
#include "server/http/http_call.h"
#include "server/http/kserve/kserve_rest.h"
#include "server/http/native/json_body.h"

namespace qvi {
namespace {

// Inference-Header-Content-Length (the binary-data extension): how much of the body is its JSON header;
// without it, all of the body.
absl::StatusOr<size_t> JsonHeaderBytes(const HttpRequest& request) {
  const std::string header = request.Header("Inference-Header-Content-Length");
  if (header.empty()) return request.body.size();
  uint64_t n = 0;
  if (!absl::SimpleAtoi(header, &n) || n > request.body.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Inference-Header-Content-Length: '", header.substr(0, 40),
                                                   "' is not a length within the body's ", request.body.size(),
                                                   " bytes"));
  }
  return static_cast<size_t>(n);
}

// An OIP ModelInfer over REST as PlanAndSubmit's steps (server/frontend/infer_steps.h): the deadline is
// X-Request-Timeout-Ms's, the answer the REST protocol's JSON, its binary outputs after it.
struct KServePlanned : Planned {
  std::shared_ptr<const oip::InferPlan> plan;  // what BuildAnswer reads of the request (its outputs, their shapes)
};

struct KServeSteps {
  std::shared_ptr<HttpCall> http;
  Core* core;
  const OipApi* oip;
  std::shared_ptr<const HttpRequest> request;
  std::shared_ptr<const rest::ParsedInfer> asked;

  Call& call() { return http->call(); }
  absl::Time WaitDeadline() const { return http->HeaderDeadline(*request); }
  absl::StatusOr<KServePlanned> Plan() {
    absl::StatusOr<OipApi::Planned> planned = oip->Plan(asked->request, http->call().loaded);
    if (!planned.ok()) return planned.status();
    KServePlanned out;
    out.method = planned->plan->method;
    out.request = std::move(planned->plan->request);  // its estimate reads the plan, which `plan` keeps
    out.servable = std::move(planned->servable);
    out.timeout = planned->plan->timeout;
    out.plan = std::move(planned->plan);
    return out;
  }
  absl::Status Prepare(InferenceRequest& r, absl::Duration timeout) {
    return http->Prepare(r, *request, core->limits().max_request_id_bytes, timeout);
  }
  void Fail(const absl::Status& status) { http->Fail(status); }
  Core::Done Answerer(KServePlanned&& planned) {
    return [call = http, oip = oip, plan = std::move(planned.plan),
            asked = asked](absl::StatusOr<InferenceResponse> answer) {
      call->AnswerWith(answer, [&]() -> absl::StatusOr<HttpResponse> { return Answer(*answer, *oip, *plan, *asked); });
    };
  }

  static absl::StatusOr<HttpResponse> Answer(const InferenceResponse& answer, const OipApi& oip,
                                             const oip::InferPlan& plan, const rest::ParsedInfer& asked) {
    inference::ModelInferResponse out;
    if (absl::Status built = oip.BuildAnswer(answer, plan, asked.request.id(), &out); !built.ok()) return built;
    absl::StatusOr<rest::InferAnswer> tensors = rest::InferResponse(out, asked);
    if (!tensors.ok()) return tensors.status();
    HttpResponse response{
        200, "application/json", tensors->header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), {}};
    if (tensors->binary.empty()) return response;
    // Outputs in binary follow the JSON: the client finds where by the header, as Triton answers.
    response.headers.emplace_back("Inference-Header-Content-Length", absl::StrCat(response.body.size()));
    response.content_type = "application/octet-stream";
    response.body += tensors->binary;
    return response;
  }
};

}  // namespace

void ServeKServeInfer(Core* core, Calls* calls, const OipApi* oip, const HttpRoute& route, HttpRequest request,
                      HttpServer::Reply reply) {
  auto call = std::make_shared<HttpCall>(calls, "ModelInfer", request, std::move(reply));
  call->call().model = route.model;
  if (absl::Status admitted = call->call().Admission(request.Header("Authorization")); !admitted.ok())
    return call->Fail(admitted);
  // The binary-data extension: the JSON header is the body's first Inference-Header-Content-Length bytes.
  absl::StatusOr<size_t> header_bytes = JsonHeaderBytes(request);
  if (!header_bytes.ok()) return call->Fail(header_bytes.status());
  const std::string_view json_text = std::string_view(request.body).substr(0, *header_bytes);
  if (absl::Status scanned = ScanBody(json_text, core->limits().max_texts); !scanned.ok()) return call->Fail(scanned);
  const nlohmann::json body = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<rest::ParsedInfer> infer =
      rest::InferRequest(body, route.model, route.version > 0 ? absl::StrCat(route.version) : "",
                         std::string_view(request.body).substr(*header_bytes));
  request.body.clear();
  if (!infer.ok()) return call->Fail(infer.status());
  PlanAndSubmit(core, KServeSteps{std::move(call), core, oip, std::make_shared<const HttpRequest>(std::move(request)),
                                  std::make_shared<const rest::ParsedInfer>(*std::move(infer))});
}

// GET /v2/models/{m}[/versions/{v}][/ready]: OIP's answers in the REST protocol's JSON.
HttpResponse KServeModelRoute(const OipApi* oip, const HttpRoute& route) {
  const std::string version = route.version > 0 ? absl::StrCat(route.version) : "";
  if (route.kind == HttpRoute::Kind::kModelReady) {
    inference::ModelReadyRequest in;
    in.set_name(route.model);
    in.set_version(version);
    inference::ModelReadyResponse out;
    if (absl::Status s = oip->ModelReady(in, &out); !s.ok()) return ErrorResponse(s);
    const nlohmann::json body = {{"name", route.model}, {"ready", out.ready()}};
    return HttpResponse{out.ready() ? 200 : 503, "application/json", body.dump(), {}};
  }
  inference::ModelMetadataRequest in;
  in.set_name(route.model);
  in.set_version(version);
  inference::ModelMetadataResponse out;
  if (absl::Status s = oip->ModelMetadata(in, &out); !s.ok()) return ErrorResponse(s);
  return HttpResponse{200,
                      "application/json",
                      rest::ModelMetadata(out).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      {}};
}

HttpResponse KServeServerMetadata() {
  inference::ServerMetadataResponse out;
  OipApi::ServerMetadata(&out);
  out.add_extensions("binary_tensor_data");  // Triton's name for the binary-data extension (REST only)
  const nlohmann::json body = {
      {"name", out.name()},
      {"version", out.version()},
      {"extensions", std::vector<std::string>(out.extensions().begin(), out.extensions().end())}};
  return HttpResponse{200, "application/json", body.dump(), {}};
}

}  // namespace qvi

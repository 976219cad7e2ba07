#include "server/http/kserve/kserve_routes.h"

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
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

// Plan, Prepare and Submit a parsed ModelInfer. A plan that resolved a model which loads on demand
// waits for it, once, within X-Request-Timeout-Ms, and plans again on the thread that loaded it, with
// the version `loaded` for it.
void PlanKServeInfer(Core* core, const OipApi* oip, std::shared_ptr<HttpCall> call,
                     std::shared_ptr<const HttpRequest> request, std::shared_ptr<const rest::ParsedInfer> asked,
                     bool waited, const ServableHandle& loaded = nullptr) {
  absl::StatusOr<OipApi::Planned> planned = oip->Plan(asked->request, loaded);
  // Waits once, or again when the version handed over is not the one asked for (as PlanInferCall does).
  if (!planned.ok() && (!waited || loaded != nullptr) && WaitsForLoad(planned.status())) {
    return core->WhenLoaded(asked->request.model_name(), call->HeaderDeadline(*request),
                            [core, oip, call, request, asked](absl::StatusOr<ServableHandle> held) {
                              if (!held.ok()) return call->Fail(held.status());
                              PlanKServeInfer(core, oip, call, request, asked, /*waited=*/true, *held);
                            });
  }
  if (!planned.ok()) return call->Fail(planned.status());
  InferenceRequest r = std::move(planned->plan->request);
  if (absl::Status s = call->Prepare(r, *request, core->limits().max_request_id_bytes, planned->plan->timeout);
      !s.ok()) {
    return call->Fail(s);
  }
  core->Submit(
      planned->plan->method, std::move(r),
      [call, oip, plan = planned->plan, asked](absl::StatusOr<InferenceResponse> answer) {
        call->AnswerWith(answer, [&]() -> absl::StatusOr<HttpResponse> {
          inference::ModelInferResponse out;
          if (absl::Status built = oip->BuildAnswer(*answer, *plan, asked->request.id(), &out); !built.ok()) {
            return built;
          }
          absl::StatusOr<rest::InferAnswer> tensors = rest::InferResponse(out, *asked);
          if (!tensors.ok()) return tensors.status();
          HttpResponse response{200,
                                "application/json",
                                tensors->header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                                {}};
          if (tensors->binary.empty()) return response;
          // Outputs in binary follow the JSON: the client finds where by the header, as Triton answers.
          response.headers.emplace_back("Inference-Header-Content-Length", absl::StrCat(response.body.size()));
          response.content_type = "application/octet-stream";
          response.body += tensors->binary;
          return response;
        });
      },
      std::move(planned->servable));
}

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
  PlanKServeInfer(core, oip, std::move(call), std::make_shared<const HttpRequest>(std::move(request)),
                  std::make_shared<const rest::ParsedInfer>(*std::move(infer)), /*waited=*/false);
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

#include "server/http/native/native_routes.h"

#include <google/protobuf/util/json_util.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/core/manifest/serving_config.h"
#include "server/frontend/native/api.h"
#include "server/http/http_call.h"
#include "server/http/native/json_body.h"
#include "server/http/native/proto_json.h"

namespace qvi {

namespace v1 = ::qvi::serving::v1;

namespace {

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  std::string out;
  if (WriteProtoJson(message, &out)) return out;  // protobuf's bytes, written directly (proto_json.h)
  out.clear();  // what the direct writer wrote before it met what it does not write (a map): protobuf's appends
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;  // a token at offset 0 says "start": 0
  const auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) return absl::InternalError(absl::StrCat("writing the answer as JSON failed: ", status.ToString()));
  return out;
}

template <typename Request, typename Response>
void Serve(Core* core, Calls* calls, Method method, const HttpRoute& route, HttpRequest request,
           HttpServer::Reply reply) {
  auto call =
      std::make_shared<HttpCall>(calls, method == Method::kClassify ? "Classify" : "Tag", request, std::move(reply));
  call->call().model = route.model;
  if (absl::Status admitted = call->call().Admission(request.Header("Authorization")); !admitted.ok())
    return call->Fail(admitted);
  Request message;
  if (absl::Status parsed = ParseBody(request.body, core->limits().max_texts, &message); !parsed.ok()) {
    return call->Fail(parsed);
  }
  request.body.clear();
  if (message.has_model() && ((!message.model().name().empty() && message.model().name() != route.model) ||
                              (message.model().version() != 0 && message.model().version() != route.version))) {
    return call->Fail(absl::InvalidArgumentError(
        "model: the body names another model or version than the path; leave it out of the body"));
  }
  message.mutable_model()->set_name(route.model);
  message.mutable_model()->set_version(route.version);
  auto decoded = std::make_shared<InferenceRequest>(
      FromProto(message.model(), message.texts(), message.options(), message.request_id(), message.priority()));
  auto build = [](const InferenceResponse& answer) -> absl::StatusOr<HttpResponse> {
    Response out;
    ToProto(answer, &out);
    absl::StatusOr<std::string> json = ToJson(out);
    if (!json.ok()) return json.status();
    return HttpResponse{200, "application/json", *std::move(json), {}};
  };
  PlanAndSubmit(core, DecodedSteps<decltype(build)>{std::move(call), core,
                                                    std::make_shared<const HttpRequest>(std::move(request)), method,
                                                    std::move(decoded), build});
}

HttpResponse JsonAnswer(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> json = ToJson(message);
  return json.ok() ? HttpResponse{200, "application/json", *json, {}} : ErrorResponse(json.status());
}

}  // namespace

void ServeNativeInfer(Core* core, Calls* calls, const HttpRoute& route, HttpRequest request, HttpServer::Reply reply) {
  if (route.kind == HttpRoute::Kind::kClassify) {
    return Serve<v1::ClassifyRequest, v1::ClassifyResponse>(core, calls, Method::kClassify, route, std::move(request),
                                                            std::move(reply));
  }
  Serve<v1::TagRequest, v1::TagResponse>(core, calls, Method::kTag, route, std::move(request), std::move(reply));
}

HttpResponse ListModelsRoute(const ModelRepository& repository) {
  v1::ListModelsResponse out;
  ListModelsAnswer(repository, &out);
  return JsonAnswer(out);
}

HttpResponse GetModelRoute(const ModelRepository& repository, const Core& core, const HttpRoute& route) {
  v1::GetModelRequest in;
  in.mutable_model()->set_name(route.model);
  in.mutable_model()->set_version(route.version);
  v1::GetModelResponse out;
  if (absl::Status s = GetModelAnswer(repository, core.limits(), in, &out, core.ShadowSummaries(route.model));
      !s.ok()) {
    return ErrorResponse(s);
  }
  return JsonAnswer(out);
}

HttpResponse SetShadowRoute(const OipRepository& control, const ModelRepository& repository, const Core& core,
                            const HttpRoute& route, const std::string& body) {
  std::optional<ShadowSettings> shadow;
  if (route.kind == HttpRoute::Kind::kSetShadow) {
    // Scanned first, as every body is: its nesting and size are bounded before it is parsed.
    if (absl::Status s = ScanBody(body, core.limits().max_texts); !s.ok()) return ErrorResponse(s);
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return ErrorResponse(absl::InvalidArgumentError("the body is not JSON"));
    absl::StatusOr<ShadowSettings> parsed = ParseShadowSettings(j, "body");
    if (!parsed.ok()) return ErrorResponse(parsed.status());
    shadow = *parsed;
  }
  if (absl::Status s = control.SetShadow(route.model, shadow); !s.ok()) return ErrorResponse(s);
  return GetShadowRoute(repository, core, route);
}

HttpResponse GetShadowRoute(const ModelRepository& repository, const Core& core, const HttpRoute& route) {
  v1::GetModelRequest in;
  in.mutable_model()->set_name(route.model);
  v1::GetModelResponse out;
  if (absl::Status s = GetModelAnswer(repository, core.limits(), in, &out, core.ShadowSummaries(route.model));
      !s.ok()) {
    return ErrorResponse(s);
  }
  v1::GetShadowResponse shadow;
  shadow.set_model(out.model().name());
  *shadow.mutable_comparisons() = out.shadow();
  return JsonAnswer(shadow);
}

}  // namespace qvi

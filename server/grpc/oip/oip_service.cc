#include "server/grpc/oip/oip_service.h"

#include <utility>

#include "server/grpc/infer_call.h"
#include "server/grpc/raw_unary.h"

namespace qvi {

grpc::ServerUnaryReactor* OipServiceImpl::ServerLive(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                     grpc::ByteBuffer* raw_response) {
  return RawUnary<inference::ServerLiveRequest, inference::ServerLiveResponse>(
      ctx, raw, raw_response, caps_, absl::OkStatus(),
      [](const inference::ServerLiveRequest&, inference::ServerLiveResponse* response) {
        response->set_live(true);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* OipServiceImpl::ServerReady(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                      grpc::ByteBuffer* raw_response) {
  return RawUnary<inference::ServerReadyRequest, inference::ServerReadyResponse>(
      ctx, raw, raw_response, caps_, absl::OkStatus(),  // a probe: no key
      [this](const inference::ServerReadyRequest&, inference::ServerReadyResponse* response) {
        response->set_ready(api_->ServerReady());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* OipServiceImpl::ModelReady(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                     grpc::ByteBuffer* raw_response) {
  return RawUnary<inference::ModelReadyRequest, inference::ModelReadyResponse>(
      ctx, raw, raw_response, caps_, absl::OkStatus(),  // a probe: no key
      [this](const inference::ModelReadyRequest& request, inference::ModelReadyResponse* response) {
        return api_->ModelReady(request, response);
      });
}

grpc::ServerUnaryReactor* OipServiceImpl::ServerMetadata(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                         grpc::ByteBuffer* raw_response) {
  return RawUnary<inference::ServerMetadataRequest, inference::ServerMetadataResponse>(
      ctx, raw, raw_response, caps_, calls_->Authorize(Authorization(ctx, *calls_), Scope::kRead),
      [](const inference::ServerMetadataRequest&, inference::ServerMetadataResponse* response) {
        OipApi::ServerMetadata(response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* OipServiceImpl::ModelMetadata(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                        grpc::ByteBuffer* raw_response) {
  return RawUnary<inference::ModelMetadataRequest, inference::ModelMetadataResponse>(
      ctx, raw, raw_response, caps_, calls_->Authorize(Authorization(ctx, *calls_), Scope::kRead),
      [this](const inference::ModelMetadataRequest& request, inference::ModelMetadataResponse* response) {
        return api_->ModelMetadata(request, response);
      });
}

grpc::ServerUnaryReactor* OipServiceImpl::ModelInfer(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                     grpc::ByteBuffer* raw_response) {
  using Planned = PlannedCall<inference::ModelInferResponse>;
  return StartInferCall<inference::ModelInferResponse>(
      calls_, core_, "ModelInfer", ctx, raw, raw_response,
      [this](const grpc::ByteBuffer& bytes, Call* call) -> absl::StatusOr<Planned> {
        inference::ModelInferRequest request;
        if (absl::Status s = DecodeRequest(bytes, caps_, &request); !s.ok()) return s;
        call->model = request.model_name();
        call->set_request_id(request.id().empty() ? calls_->NextRequestId() : request.id());
        absl::StatusOr<OipApi::Planned> plan = api_->Plan(request, call->loaded);
        if (!plan.ok()) return plan.status();
        Planned planned;
        planned.method = plan->plan->method;
        planned.servable = std::move(plan->servable);
        planned.timeout = plan->plan->timeout;
        planned.request = std::move(plan->plan->request);  // its estimate reads the plan, which `build` keeps
        planned.build = [api = api_, answer_plan = plan->plan, id = request.id()](
                            const InferenceResponse& answer, inference::ModelInferResponse* response) {
          return api->BuildAnswer(answer, *answer_plan, id, response);
        };
        return planned;
      });
}

}  // namespace qvi

#include "server/grpc/native/inference_service.h"

#include "server/frontend/native/api.h"
#include "server/grpc/infer_call.h"
#include "server/grpc/raw_unary.h"

namespace qvi {

namespace v1 = ::qvi::serving::v1;

template <typename Request, typename Response>
grpc::ServerUnaryReactor* InferenceServiceImpl::Infer(Method method, grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw, grpc::ByteBuffer* raw_response) {
  const char* name = method == Method::kClassify ? "Classify" : "Tag";
  return StartInferCall<Response>(
      calls_, core_, name, ctx, raw, raw_response,
      [this, method](const grpc::ByteBuffer& bytes, Call*) -> absl::StatusOr<PlannedCall<Response>> {
        Request request;
        if (absl::Status s = DecodeRequest(bytes, caps_, &request); !s.ok()) return s;
        PlannedCall<Response> planned;
        planned.method = method;
        planned.request =
            FromProto(request.model(), request.texts(), request.options(), request.request_id(), request.priority());
        planned.build = [](const InferenceResponse& answer, Response* response) {
          ToProto(answer, response);
          return absl::OkStatus();
        };
        return planned;
      });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::Classify(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return Infer<v1::ClassifyRequest, v1::ClassifyResponse>(Method::kClassify, ctx, request, response);
}

grpc::ServerUnaryReactor* InferenceServiceImpl::Tag(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Infer<v1::TagRequest, v1::TagResponse>(Method::kTag, ctx, request, response);
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ListModels(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return RawUnary<v1::ListModelsRequest, v1::ListModelsResponse>(
      ctx, request, response, caps_, calls_->Authorize(Authorization(ctx), Scope::kRead),
      [this](const v1::ListModelsRequest&, v1::ListModelsResponse* out) {
        ListModelsAnswer(*repository_, out);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::GetModel(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return RawUnary<v1::GetModelRequest, v1::GetModelResponse>(
      ctx, request, response, caps_, calls_->Authorize(Authorization(ctx), Scope::kRead),
      [this](const v1::GetModelRequest& r, v1::GetModelResponse* out) {
        return GetModelAnswer(*repository_, core_->limits(), r, out);
      });
}

}  // namespace qvi

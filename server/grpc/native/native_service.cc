#include "server/grpc/native/native_service.h"

#include "server/frontend/native/api.h"
#include "server/grpc/infer_call.h"
#include "server/grpc/raw_unary.h"

namespace qvi {

namespace v1 = ::qvi::serving::v1;

namespace {

// Decodes a native request and plans it: `fill(answer, &message)` makes the API's message of the
// core's answer.
template <typename Request, typename Message, typename Fill>
absl::StatusOr<PlannedCall<Message>> PlanNative(Method method, const WireCaps& caps, const grpc::ByteBuffer& bytes,
                                                Fill fill) {
  Request request;
  if (absl::Status s = DecodeRequest(bytes, caps, &request); !s.ok()) return s;
  PlannedCall<Message> planned;
  planned.method = method;
  planned.request =
      FromProto(request.model(), request.texts(), request.options(), request.request_id(), request.priority());
  planned.build = [fill = std::move(fill)](const InferenceResponse& answer, Message* message) {
    fill(answer, message);
    return absl::OkStatus();
  };
  return planned;
}

}  // namespace

template <typename Request, typename Response>
grpc::ServerUnaryReactor* InferenceServiceImpl::Infer(Method method, grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw, grpc::ByteBuffer* raw_response) {
  const char* name = method == Method::kClassify ? "Classify" : "Tag";
  return StartInferCall<Response>(
      calls_, core_, name, ctx, raw, raw_response, [this, method](const grpc::ByteBuffer& bytes, Call*) {
        return PlanNative<Request, Response>(
            method, caps_, bytes, [](const InferenceResponse& answer, Response* out) { ToProto(answer, out); });
      });
}

template <typename Request, typename StreamResponse>
RawStreamReactor* InferenceServiceImpl::Stream(Method method, grpc::CallbackServerContext* ctx) {
  typename InferStream<StreamResponse>::Options options;
  options.core = core_;
  options.calls = calls_;
  options.method = method == Method::kClassify ? "ClassifyStream" : "TagStream";
  options.max_inflight = max_stream_inflight_;
  options.plan = [this, method](const grpc::ByteBuffer& bytes, Call*, int64_t index) {
    return PlanNative<Request, StreamResponse>(method, caps_, bytes,
                                               [index](const InferenceResponse& answer, StreamResponse* out) {
                                                 out->set_index(index);
                                                 out->set_request_id(answer.request_id);
                                                 ToProto(answer, out->mutable_response());
                                               });
  };
  return new InferStream<StreamResponse>(std::move(options), ctx);
}

RawStreamReactor* InferenceServiceImpl::ClassifyStream(grpc::CallbackServerContext* ctx) {
  return Stream<v1::ClassifyRequest, v1::ClassifyStreamResponse>(Method::kClassify, ctx);
}

RawStreamReactor* InferenceServiceImpl::TagStream(grpc::CallbackServerContext* ctx) {
  return Stream<v1::TagRequest, v1::TagStreamResponse>(Method::kTag, ctx);
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
      ctx, request, response, caps_, calls_->Authorize(Authorization(ctx, *calls_), Scope::kRead),
      [this](const v1::ListModelsRequest&, v1::ListModelsResponse* out) {
        ListModelsAnswer(*repository_, out);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::GetModel(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return RawUnary<v1::GetModelRequest, v1::GetModelResponse>(
      ctx, request, response, caps_, calls_->Authorize(Authorization(ctx, *calls_), Scope::kRead),
      [this](const v1::GetModelRequest& r, v1::GetModelResponse* out) {
        return GetModelAnswer(*repository_, core_->limits(), r, out, core_->ShadowSummaries(r.model().name()));
      });
}

}  // namespace qvi

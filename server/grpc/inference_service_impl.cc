#include "server/grpc/inference_service_impl.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/text/tokenizer.h"
#include "server/grpc/convert.h"
#include "server/grpc/raw_unary.h"
#include "server/logging.h"

namespace qvi {

namespace v1 = ::qvi::serving::v1;

template <typename Request, typename Response>
grpc::ServerUnaryReactor* InferenceServiceImpl::Infer(Method method, grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw, grpc::ByteBuffer* raw_response) {
  const char* name = method == Method::kClassify ? "Classify" : "Tag";
  return StartInferCall<Response>(
      calls_, core_, name, ctx, raw, raw_response,
      [this, method](const grpc::ByteBuffer& bytes, InferCall*) -> absl::StatusOr<PlannedCall<Response>> {
        Request request;
        if (absl::Status s = DecodeRequest(bytes, caps_, &request); !s.ok()) return s;
        PlannedCall<Response> planned;
        planned.method = method;
        planned.request = FromProto(request.model(), request.texts(), request.options(), request.request_id());
        planned.build = [](const InferenceResponse& answer, Response* response) {
          ToProto(answer, response);
          return grpc::Status::OK;
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
      ctx, request, response, caps_, [this](const v1::ListModelsRequest&, v1::ListModelsResponse* out) {
        for (const ModelStatus& m : repository_->List()) ToProto(m, out->add_models());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::GetModel(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return RawUnary<v1::GetModelRequest, v1::GetModelResponse>(
      ctx, request, response, caps_,
      [this](const v1::GetModelRequest& r, v1::GetModelResponse* out) { return GetModel(r, out); });
}

absl::Status InferenceServiceImpl::GetModel(const v1::GetModelRequest& request, v1::GetModelResponse* response) const {
  const std::string& name = request.model().name();
  if (absl::Status s = CheckModelNameBytes("model.name", name, core_->limits()); !s.ok()) return s;
  absl::StatusOr<ModelStatus> m = repository_->Get(name);
  if (!m.ok()) return m.status();
  if (const int64_t want = request.model().version(); want != 0) {
    std::vector<VersionStatus> keep;
    for (VersionStatus& v : m->versions) {
      if (v.version == want) keep.push_back(std::move(v));
    }
    if (keep.empty()) return absl::NotFoundError(absl::StrCat("model '", m->name, "' has no version ", want));
    m->versions = std::move(keep);
  }
  ToProto(*m, response->mutable_model());
  return absl::OkStatus();
}

}  // namespace qvi

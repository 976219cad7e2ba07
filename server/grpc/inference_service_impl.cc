#include "server/grpc/inference_service_impl.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/text/tokenizer.h"
#include "server/grpc/convert.h"
#include "server/logging.h"

namespace qvi {

namespace v1 = ::qvi::serving::v1;

namespace {

// Why a request that protobuf could not parse was bad: the first text (field 2 of ClassifyRequest and
// TagRequest) that is not UTF-8, found by walking the top-level fields with protobuf's wire readers.
absl::Status ExplainParseFailure(const grpc::ByteBuffer& buffer) {
  grpc::ByteBuffer copy(buffer);
  grpc::ProtoBufferReader reader(&copy);
  google::protobuf::io::CodedInputStream in(&reader);
  using google::protobuf::internal::WireFormatLite;
  int index = 0;
  while (uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) == 2 &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      std::string text;
      if (!WireFormatLite::ReadBytes(&in, &text)) break;
      if (absl::Status s = ValidateUtf8(text); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("texts[", index, "]: ", s.message()));
      }
      ++index;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      break;
    }
  }
  return absl::InvalidArgumentError("the request is not a valid protobuf message");
}

}  // namespace

template <typename Request, typename Response>
grpc::ServerUnaryReactor* InferenceServiceImpl::Infer(Method method, grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw, grpc::ByteBuffer* raw_response) {
  const char* name = method == Method::kClassify ? "Classify" : "Tag";
  return StartInferCall<Response>(
      calls_, core_, name, ctx, raw, raw_response,
      [method](const grpc::ByteBuffer& bytes, InferCall*) -> absl::StatusOr<PlannedCall<Response>> {
        Request request;
        grpc::ByteBuffer copy(bytes);
        grpc::ProtoBufferReader reader(&copy);
        if (!request.ParseFromZeroCopyStream(&reader)) return ExplainParseFailure(bytes);
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
                                                           const v1::ListModelsRequest*,
                                                           v1::ListModelsResponse* response) {
  for (const ModelStatus& m : repository_->List()) ToProto(m, response->add_models());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceServiceImpl::GetModel(grpc::CallbackServerContext* ctx,
                                                         const v1::GetModelRequest* request,
                                                         v1::GetModelResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const std::string& name = request->model().name();
  if (absl::Status s = CheckModelNameBytes("model.name", name, core_->limits()); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  absl::StatusOr<ModelStatus> m = repository_->Get(name);
  if (m.ok() && request->model().version() != 0) {
    const int64_t want = request->model().version();
    std::vector<VersionStatus> keep;
    for (VersionStatus& v : m->versions) {
      if (v.version == want) keep.push_back(std::move(v));
    }
    if (keep.empty()) {
      m = absl::NotFoundError(absl::StrCat("model '", m->name, "' has no version ", want));
    } else {
      m->versions = std::move(keep);
    }
  }
  if (m.ok()) ToProto(*m, response->mutable_model());
  reactor->Finish(ToGrpcStatus(m.status()));
  return reactor;
}

}  // namespace qvi

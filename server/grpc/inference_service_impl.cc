#include "server/grpc/inference_service_impl.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/tokenizer.h"
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

absl::Time Deadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

}  // namespace

void InferenceServiceImpl::Record(Method method, const std::string& peer, const std::string& model,
                                  const std::string& request_id, int64_t texts, const grpc::Status& status,
                                  absl::Time start, const InferenceResponse* response) const {
  const absl::Duration latency = absl::Now() - start;
  const char* method_name = method == Method::kClassify ? "Classify" : "Tag";
  const int64_t version = response != nullptr ? response->version : 0;
  const std::string code = StatusCodeName(status.error_code());
  if (options_.metrics != nullptr) {
    // Only names in the store become label values (see metrics.h).
    const bool known = version > 0 || repository_->Has(model);
    options_.metrics->OnRequestDone(method_name, known ? model : "_unknown", version, code, latency);
  }
  if (options_.access_log) {
    AccessRecord a;
    a.method = method_name;
    a.peer = peer;
    a.model = Capped(model);
    a.version = version;
    a.request_id = Capped(request_id);
    a.texts = texts;
    a.code = static_cast<int>(status.error_code());
    a.code_name = code;
    a.ms = absl::ToDoubleMilliseconds(latency);
    if (response != nullptr) {
      a.tokens = response->tokens;
      a.queue_ms = absl::ToDoubleMilliseconds(response->queue_time);
      a.compute_ms = absl::ToDoubleMilliseconds(response->compute_time);
    }
    LogAccess(a);
  }
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* InferenceServiceImpl::Infer(Method method, grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw, grpc::ByteBuffer* raw_response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  if (options_.metrics != nullptr) options_.metrics->OnRequestStart();
  std::string peer = options_.access_log ? ctx->peer() : std::string();
  // Memory admitted by bytes: the request's bytes count against the limit until it is answered.
  const int64_t bytes = static_cast<int64_t>(raw->Length());
  const int64_t held = inflight_bytes_.fetch_add(bytes) + bytes;
  if (options_.max_inflight_request_bytes > 0 && held > options_.max_inflight_request_bytes) {
    inflight_bytes_.fetch_sub(bytes);
    const grpc::Status status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              absl::StrCat("requests in flight would hold ", held, " bytes, over the limit of ",
                                           options_.max_inflight_request_bytes,
                                           " bytes (--max-inflight-request-bytes); retry with backoff"));
    Record(method, peer, "", "", 0, status, start, nullptr);
    reactor->Finish(status);
    return reactor;
  }
  Request request;
  {
    grpc::ByteBuffer copy(*raw);
    grpc::ProtoBufferReader reader(&copy);
    if (!request.ParseFromZeroCopyStream(&reader)) {
      inflight_bytes_.fetch_sub(bytes);
      const grpc::Status status = ToGrpcStatus(ExplainParseFailure(*raw));
      Record(method, peer, "", "", 0, status, start, nullptr);
      reactor->Finish(status);
      return reactor;
    }
  }
  InferenceRequest r = FromProto(request.model(), request.texts(), request.options(), request.request_id());
  if (r.request_id.empty()) r.request_id = absl::StrCat("req-", next_id_.fetch_add(1));
  r.deadline = Deadline(ctx);
  r.is_cancelled = [ctx] { return ctx->IsCancelled(); };
  std::string model = r.model;
  const int64_t texts = static_cast<int64_t>(r.texts.size());
  std::string request_id = r.request_id;
  core_->Submit(method, std::move(r),
                [this, reactor, raw_response, start, peer = std::move(peer), model = std::move(model),
                 request_id = std::move(request_id), texts, method, bytes](absl::StatusOr<InferenceResponse> out) {
                  inflight_bytes_.fetch_sub(bytes);
                  grpc::Status status = ToGrpcStatus(out.status());
                  if (out.ok()) {
                    Response response;
                    ToProto(*out, &response);
                    bool own = false;
                    status = grpc::SerializationTraits<Response>::Serialize(response, raw_response, &own);
                  }
                  Record(method, peer, model, request_id, texts, status, start, out.ok() ? &*out : nullptr);
                  reactor->Finish(status);
                });
  return reactor;
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
  if (static_cast<int64_t>(name.size()) > core_->limits().max_model_name_bytes) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 absl::StrCat("model.name: ", name.size(), " bytes exceed the limit of ",
                                              core_->limits().max_model_name_bytes, " bytes")));
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

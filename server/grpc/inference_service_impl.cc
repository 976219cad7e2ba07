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
                                  absl::Time start, const AnswerSummary* answer) const {
  const absl::Duration latency = absl::Now() - start;
  const char* method_name = method == Method::kClassify ? "Classify" : "Tag";
  const int64_t version = answer != nullptr ? answer->version : 0;
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
    if (answer != nullptr) {
      a.tokens = answer->tokens;
      a.queue_ms = absl::ToDoubleMilliseconds(answer->queue);
      a.compute_ms = absl::ToDoubleMilliseconds(answer->compute);
    }
    LogAccess(a);
  }
}

// One Classify or Tag call, from its arrival to gRPC's OnDone. Answer() finishes it once (a second
// answer is ignored) and releases its request bytes; OnDone() counts it with the status the client
// really got, and deletes it.
class InferenceServiceImpl::Call final : public grpc::ServerUnaryReactor {
 public:
  Call(InferenceServiceImpl* service, grpc::CallbackServerContext* ctx, Method method)
      : service_(service), ctx_(ctx), method_(method), start_(absl::Now()) {
    if (service_->options_.access_log) peer_ = ctx->peer();
  }

  void Answer(const grpc::Status& status, const AnswerSummary* answer = nullptr) {
    if (answered_.exchange(true)) return;
    // The request's bytes stop counting against --max-inflight-request-bytes once its answer is
    // handed over: a client that has its answer (a refusal included) may send the next request at
    // once, and gRPC's own buffers until OnDone are bounded by its resource quota.
    service_->inflight_bytes_.fetch_sub(bytes_);
    status_ = status;
    if (answer != nullptr) answer_ = *answer;
    answer_valid_ = answer != nullptr;
    Finish(status);
  }

  void OnDone() override {
    grpc::Status seen = status_;
    if (ctx_->IsCancelled()) {
      // The client never got this status: its deadline passed, it cancelled, or the connection broke.
      const bool expired = Deadline(ctx_) <= absl::Now();
      seen = grpc::Status(expired ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::CANCELLED,
                          "the answer did not reach the client");
    }
    try {
      service_->Record(method_, peer_, model_, request_id_, texts_, seen, start_,
                       answer_valid_ && seen.ok() ? &answer_ : nullptr);
    } catch (...) {
      spdlog::error("counting a finished {} call failed: {}", method_ == Method::kClassify ? "Classify" : "Tag",
                    CurrentExceptionText());
    }
    delete this;
  }

  // Set while the call is prepared, before it is handed to the core.
  int64_t bytes_ = 0;
  std::string model_, request_id_;
  int64_t texts_ = 0;

 private:
  InferenceServiceImpl* const service_;
  grpc::CallbackServerContext* const ctx_;
  const Method method_;
  const absl::Time start_;
  std::string peer_;
  std::atomic<bool> answered_{false};
  // Written by Answer() before Finish(); read in OnDone(), which gRPC runs after it.
  grpc::Status status_;
  AnswerSummary answer_;
  bool answer_valid_ = false;
};

template <typename Request, typename Response>
grpc::ServerUnaryReactor* InferenceServiceImpl::Infer(Method method, grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw, grpc::ByteBuffer* raw_response) {
  auto* call = new Call(this, ctx, method);
  if (options_.metrics != nullptr) options_.metrics->OnRequestStart();
  // Memory admitted by bytes: the request's bytes count against the limit until it is answered.
  const int64_t bytes = static_cast<int64_t>(raw->Length());
  const int64_t held = inflight_bytes_.fetch_add(bytes) + bytes;
  call->bytes_ = bytes;
  if (options_.max_inflight_request_bytes > 0 && held > options_.max_inflight_request_bytes) {
    call->Answer(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              absl::StrCat("requests in flight would hold ", held, " bytes, over the limit of ",
                                           options_.max_inflight_request_bytes,
                                           " bytes (--max-inflight-request-bytes); retry with backoff")));
    return call;
  }
  try {
    Request request;
    {
      grpc::ByteBuffer copy(*raw);
      grpc::ProtoBufferReader reader(&copy);
      if (!request.ParseFromZeroCopyStream(&reader)) {
        call->Answer(ToGrpcStatus(ExplainParseFailure(*raw)));
        return call;
      }
    }
    InferenceRequest r = FromProto(request.model(), request.texts(), request.options(), request.request_id());
    if (r.request_id.empty()) r.request_id = absl::StrCat("req-", next_id_.fetch_add(1));
    r.deadline = Deadline(ctx);
    r.is_cancelled = [ctx] { return ctx->IsCancelled(); };
    call->model_ = r.model;
    call->texts_ = static_cast<int64_t>(r.texts.size());
    call->request_id_ = r.request_id;
    core_->Submit(method, std::move(r), [this, call, raw_response](absl::StatusOr<InferenceResponse> out) {
      if (!out.ok()) {
        call->Answer(ToGrpcStatus(out.status()));
        return;
      }
      grpc::Status status;
      try {
        Response response;
        ToProto(*out, &response);
        bool own = false;
        status = grpc::SerializationTraits<Response>::Serialize(response, raw_response, &own);
        if (status.ok() && options_.max_response_bytes > 0 &&
            static_cast<int64_t>(raw_response->Length()) > options_.max_response_bytes) {
          status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                absl::StrCat("the answer is ", raw_response->Length(), " bytes, over the limit of ",
                                             options_.max_response_bytes,
                                             " bytes (--max-message-bytes); ask for fewer texts or outputs"));
          raw_response->Clear();
        }
      } catch (...) {
        status = grpc::Status(grpc::StatusCode::INTERNAL,
                              absl::StrCat("building the answer failed: ", CurrentExceptionText()));
      }
      const AnswerSummary summary{out->version, out->tokens, out->queue_time, out->compute_time};
      call->Answer(status, status.ok() ? &summary : nullptr);
    });
  } catch (...) {  // bad_alloc parsing or preparing: this call fails, the server goes on
    call->Answer(grpc::Status(grpc::StatusCode::INTERNAL,
                              absl::StrCat("accepting the request failed: ", CurrentExceptionText())));
  }
  return call;
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

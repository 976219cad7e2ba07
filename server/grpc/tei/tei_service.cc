#include "server/grpc/tei/tei_service.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/frontend/drop_in_model.h"
#include "server/frontend/tei/tokens.h"
#include "server/grpc/infer_call.h"
#include "server/grpc/infer_stream.h"
#include "server/grpc/raw_unary.h"

namespace qvi {
namespace {

namespace tv1 = ::tei::v1;

constexpr char kHowToName[] = "name one in the qvi-model metadata";

// The model the call names in its `qvi-model` metadata (a gRPC call has no path), else the default rule.
absl::StatusOr<std::string> TeiModel(const grpc::CallbackServerContext* ctx, const TeiGrpc& tei) {
  std::string named;
  const auto& metadata = ctx->client_metadata();
  if (const auto it = metadata.find("qvi-model"); it != metadata.end()) {
    named.assign(it->second.data(), it->second.size());
    if (static_cast<int>(named.size()) > tei.core->limits().max_model_name_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("qvi-model: a name of ", named.size(),
                                                     " bytes, over the limit of ",
                                                     tei.core->limits().max_model_name_bytes));
    }
  }
  return ChooseModel(named, tei.default_model, *tei.repository, kHowToName);
}

absl::Status Empty(const std::string& text) {
  return text.empty() ? absl::InvalidArgumentError("Input validation error: `inputs` cannot be empty")
                      : absl::OkStatus();
}

// The text's characters (Unicode code points), as TEI's compute_chars counts them.
size_t Characters(const std::string& text) {
  size_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// TEI's Metadata of an answer: the text's characters and tokens, and the times.
void FillMetadata(const InferenceResponse& answer, size_t chars, tv1::Metadata* m) {
  m->set_compute_chars(static_cast<uint32_t>(chars));
  m->set_compute_tokens(static_cast<uint32_t>(answer.tokens));
  m->set_queue_time_ns(static_cast<uint64_t>(absl::ToInt64Nanoseconds(answer.queue_time)));
  m->set_inference_time_ns(static_cast<uint64_t>(absl::ToInt64Nanoseconds(answer.compute_time)));
  m->set_total_time_ns(static_cast<uint64_t>(absl::ToInt64Nanoseconds(answer.queue_time + answer.compute_time)));
}

// A request the core has no part in (Tokenize, Decode; a unary call's or a stream's), admitted: prepared as
// every call is, then answered here with `handle(request, model, &response)`, serialised into `raw_response`.
template <typename Request, typename Response, typename Handle>
absl::Status AnswerTokens(const TeiGrpc& tei, const absl::StatusOr<std::string>& model, Call& call,
                          const grpc::ByteBuffer& raw, absl::Time deadline, grpc::ByteBuffer* raw_response,
                          const Handle& handle) {
  if (model.ok()) call.model = *model;
  if (!model.ok()) return model.status();
  Request request;
  if (absl::Status s = DecodeRequest(raw, tei.caps, &request); !s.ok()) return s;
  InferenceRequest counted;  // what the call layer counts and limits: the model and one text
  counted.model = *model;
  counted.texts.resize(1);
  if (absl::Status s =
          call.Prepare(counted, "", MonotonicDeadline(tei.core->env(), deadline), absl::InfiniteDuration(), nullptr);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<ServableHandle> servable = tei.repository->Resolve(*model, 0);
  if (!servable.ok()) return servable.status();
  Response response;
  if (absl::Status s = handle(request, *(*servable)->model, &response); !s.ok()) return s;
  // The answer's size against the send limit, and its bytes held in flight, as every answer's are.
  const int64_t bytes = static_cast<int64_t>(response.ByteSizeLong());
  const int64_t limit = tei.core->limits().max_response_bytes;
  if (limit > 0 && bytes > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("the answer would be ", bytes, " bytes, over the limit of ", limit, " (--max-message-bytes)"));
  }
  if (absl::Status s = counted.hold_answer_bytes(bytes); !s.ok()) return s;
  bool own = false;
  return FromGrpcStatus(grpc::SerializationTraits<Response>::Serialize(response, raw_response, &own));
}

// A unary Tokenize or Decode: admitted as every call is, then AnswerTokens.
template <typename Request, typename Response, typename Handle>
grpc::ServerUnaryReactor* ServeTokens(const TeiGrpc& tei, const char* method, grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* raw, grpc::ByteBuffer* raw_response, Handle&& handle) {
  auto* call = new InferCall(tei.calls, ctx, method, static_cast<int64_t>(raw->Length()));
  absl::Status status = call->call().Admission(Authorization(ctx, *tei.calls));
  try {
    const absl::StatusOr<std::string> model = TeiModel(ctx, tei);
    if (model.ok()) call->call().model = *model;
    if (status.ok()) {
      status = AnswerTokens<Request, Response>(tei, model, call->call(), *raw, Deadline(ctx), raw_response, handle);
    }
  } catch (...) {
    status = absl::InternalError(absl::StrCat("answering failed: ", CurrentExceptionText()));
  }
  call->Answer(status);
  return call;
}

// The same requests as a stream (TokenizeStream, DecodeStream): each answered as it is read, in order; the first
// that fails ends the stream (infer_stream.h). The model is the stream's metadata's, chosen once.
template <typename Request, typename Response, typename Handle>
RawStreamReactor* StreamTokens(const TeiGrpc& tei, const char* method, grpc::CallbackServerContext* ctx,
                               Handle handle) {
  typename InferStream<Response>::Options options;
  options.core = tei.core;
  options.calls = tei.calls;
  options.method = method;
  options.max_inflight = tei.max_stream_inflight;
  options.answer = [tei = &tei, model = TeiModel(ctx, tei), handle = std::move(handle)](
                       const grpc::ByteBuffer& raw, Call* call, absl::Time deadline, grpc::ByteBuffer* response) {
    return AnswerTokens<Request, Response>(*tei, model, *call, raw, deadline, response, handle);
  };
  return new InferStream<Response>(std::move(options), ctx);
}

// Tokenize's answer: the text's tokens (frontend/tei/tokens.h), byte offsets.
struct Encode {
  int64_t max_bytes;  // --max-text-bytes
  absl::Status operator()(const tv1::EncodeRequest& request, const Model& model, tv1::EncodeResponse* out) const {
    if (absl::Status s = Empty(request.inputs()); !s.ok()) return s;
    if (static_cast<int64_t>(request.inputs().size()) > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("inputs: ", request.inputs().size(), " bytes, over the limit of ",
                                                     max_bytes, " (--max-text-bytes)"));
    }
    if (request.has_prompt_name()) {
      return absl::InvalidArgumentError("prompt_name: these models have no prompts (an embedding model's, in TEI)");
    }
    absl::StatusOr<std::vector<TeiToken>> tokens = TeiTokens(model, request.inputs(), request.add_special_tokens());
    if (!tokens.ok()) return tokens.status();
    for (const TeiToken& t : *tokens) {
      tv1::SimpleToken* token = out->add_tokens();
      token->set_id(static_cast<uint32_t>(t.id));
      token->set_text(t.text);
      token->set_special(t.special);
      if (!t.special) {
        token->set_start(t.start);
        token->set_stop(t.stop);
      }
    }
    return absl::OkStatus();
  }
};

// Decode's answer: the ids back to text.
absl::Status DecodeIds(const tv1::DecodeRequest& request, const Model& model, tv1::DecodeResponse* out) {
  if (request.ids().empty()) return absl::InvalidArgumentError("Input validation error: `input_ids` cannot be empty");
  const std::vector<int64_t> ids(request.ids().begin(), request.ids().end());
  absl::StatusOr<std::string> text = TeiDecodeIds(model, ids, request.skip_special_tokens());
  if (!text.ok()) {
    const bool positioned = absl::StartsWith(text.status().message(), "[");
    return absl::Status(text.status().code(), absl::StrCat("ids", positioned ? "" : ": ", text.status().message()));
  }
  out->set_text(*std::move(text));
  return absl::OkStatus();
}

// A Predict request (a unary call's or a stream's) for the core: every label, best first, and TEI's Metadata.
absl::StatusOr<PlannedCall<tv1::PredictResponse>> PlanPredict(const TeiGrpc& tei,
                                                              const absl::StatusOr<std::string>& model,
                                                              const grpc::ByteBuffer& bytes, Call* call) {
  tv1::PredictRequest request;
  if (absl::Status s = DecodeRequest(bytes, tei.caps, &request); !s.ok()) return s;
  if (!model.ok()) return model.status();
  call->model = *model;
  if (absl::Status s = Empty(request.inputs()); !s.ok()) return s;
  if (request.raw_scores()) {
    return absl::InvalidArgumentError("raw_scores: the models' logits are not answered here (only probabilities)");
  }
  if (request.truncation_direction() != tv1::TRUNCATION_DIRECTION_RIGHT) {
    return absl::InvalidArgumentError("truncation_direction: only RIGHT (texts are cut at their end)");
  }
  PlannedCall<tv1::PredictResponse> planned;
  planned.method = Method::kClassify;
  planned.request.model = *model;
  planned.request.texts = {request.inputs()};
  planned.request.options.top_k = 1 << 20;  // every label, best first, as TEI answers
  planned.request.options.error_on_truncation = !request.truncate();
  planned.build = [chars = Characters(request.inputs())](const InferenceResponse& answer, tv1::PredictResponse* out) {
    if (answer.results.size() != 1) return absl::InternalError("the answer is not one text's");
    for (const auto& [label, score] : answer.results[0].labels) {
      tv1::Prediction* p = out->add_predictions();
      p->set_label(label);
      p->set_score(score);
    }
    FillMetadata(answer, chars, out->mutable_metadata());
    return absl::OkStatus();
  };
  return planned;
}

}  // namespace

grpc::ServerUnaryReactor* TeiInfoService::Info(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                               grpc::ByteBuffer* raw_response) {
  return RawUnary<tv1::InfoRequest, tv1::InfoResponse>(
      ctx, raw, raw_response, tei_->caps, tei_->calls->Authorize(Authorization(ctx, *tei_->calls), Scope::kRead),
      [this, ctx](const tv1::InfoRequest&, tv1::InfoResponse* out) -> absl::Status {
        absl::StatusOr<std::string> model = TeiModel(ctx, *tei_);
        if (!model.ok()) return model.status();
        absl::StatusOr<ServableHandle> servable = tei_->repository->Resolve(*model, 0);
        if (!servable.ok()) return servable.status();
        const Manifest& m = (*servable)->model->manifest();
        if (m.task != Task::kClassification) {
          return absl::FailedPreconditionError(absl::StrCat("model '", m.name,
                                                            "' is a tagger: TEI's Info has no "
                                                            "type for one (GET /models/{m}/info names it)"));
        }
        const std::string precision = (*servable)->model->precision();
        out->set_version(QVI_VERSION);
        out->set_model_id(m.name);
        out->set_model_dtype(precision.empty() ? "float32" : precision);
        out->set_model_type(tv1::MODEL_TYPE_CLASSIFIER);
        out->set_max_concurrent_requests(static_cast<uint32_t>((*servable)->serving.max_queued_texts));
        out->set_max_input_length(static_cast<uint32_t>(m.tokenizer.max_tokens));
        out->set_max_batch_tokens(static_cast<uint32_t>((*servable)->serving.max_batch_tokens));
        out->set_max_batch_requests(static_cast<uint32_t>((*servable)->serving.max_batch_size));
        out->set_max_client_batch_size(static_cast<uint32_t>(tei_->core->limits().max_texts));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* TeiPredictService::Predict(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                     grpc::ByteBuffer* raw_response) {
  return StartInferCall<tv1::PredictResponse>(tei_->calls, tei_->core, "TeiPredict", ctx, raw, raw_response,
                                              [tei = tei_, ctx](const grpc::ByteBuffer& bytes, Call* call) {
                                                return PlanPredict(*tei, TeiModel(ctx, *tei), bytes, call);
                                              });
}

RawStreamReactor* TeiPredictService::PredictStream(grpc::CallbackServerContext* ctx) {
  InferStream<tv1::PredictResponse>::Options options;
  options.core = tei_->core;
  options.calls = tei_->calls;
  options.method = "TeiPredictStream";
  options.max_inflight = tei_->max_stream_inflight;
  options.plan = [tei = tei_, model = TeiModel(ctx, *tei_)](const grpc::ByteBuffer& bytes, Call* call, int64_t) {
    return PlanPredict(*tei, model, bytes, call);
  };
  return new InferStream<tv1::PredictResponse>(std::move(options), ctx);
}

grpc::ServerUnaryReactor* TeiTokenizeService::Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                       grpc::ByteBuffer* raw_response) {
  return ServeTokens<tv1::EncodeRequest, tv1::EncodeResponse>(*tei_, "TeiTokenize", ctx, raw, raw_response,
                                                              Encode{tei_->core->limits().max_text_bytes});
}

grpc::ServerUnaryReactor* TeiTokenizeService::Decode(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                     grpc::ByteBuffer* raw_response) {
  return ServeTokens<tv1::DecodeRequest, tv1::DecodeResponse>(*tei_, "TeiDecode", ctx, raw, raw_response, DecodeIds);
}

RawStreamReactor* TeiTokenizeService::TokenizeStream(grpc::CallbackServerContext* ctx) {
  return StreamTokens<tv1::EncodeRequest, tv1::EncodeResponse>(*tei_, "TeiTokenizeStream", ctx,
                                                               Encode{tei_->core->limits().max_text_bytes});
}

RawStreamReactor* TeiTokenizeService::DecodeStream(grpc::CallbackServerContext* ctx) {
  return StreamTokens<tv1::DecodeRequest, tv1::DecodeResponse>(*tei_, "TeiDecodeStream", ctx, DecodeIds);
}

}  // namespace qvi

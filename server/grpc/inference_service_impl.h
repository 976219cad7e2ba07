// The gRPC adapter: qvi.serving.v1.Inference on the callback API, over the core InferenceService.
//
// Each method does the same few things and nothing else: convert the request, turn the deadline
// and cancellation into the core's terms, hand the work to the core, convert the answer and the
// status once, and log the access line. No reactor callback blocks: Classify and Tag finish from
// the core's executor thread; ListModels and GetModel only read the repository's state.
//
// Classify and Tag are counted (metrics, access log) when gRPC says the call is over (OnDone),
// not when the answer is handed over: an answer that never reached the client (cut by a deadline,
// a cancellation or a closed connection after the model ran) counts as DEADLINE_EXCEEDED or
// CANCELLED, never as OK. An answer larger than the send limit is not sent: the client gets
// RESOURCE_EXHAUSTED saying so. Nothing on the answer path may throw into gRPC: a failure while
// building the answer (std::bad_alloc, say) answers that call with INTERNAL.
#ifndef QVI_SERVER_GRPC_INFERENCE_SERVICE_IMPL_H_
#define QVI_SERVER_GRPC_INFERENCE_SERVICE_IMPL_H_

#include <atomic>

#include "qvi/serving/v1/inference.grpc.pb.h"
#include "server/core/inference_service.h"
#include "server/core/model_repository.h"
#include "server/metrics/metrics.h"

namespace qvi {

// Classify and Tag are taken as raw bytes and parsed here, because protobuf rejects a proto3
// string that is not UTF-8 before any handler runs, and the client must learn which text was bad
// (INVALID_ARGUMENT naming texts[i]) rather than get an opaque parse failure.
using InferenceBase = serving::v1::Inference::WithRawCallbackMethod_Classify<
    serving::v1::Inference::WithRawCallbackMethod_Tag<serving::v1::Inference::CallbackService>>;

class InferenceServiceImpl final : public InferenceBase {
 public:
  struct Options {
    bool access_log = false;
    Metrics* metrics = nullptr;  // may be null
    // Bytes of Classify/Tag requests received and not yet answered, at most; a call that would go
    // over is refused at once with RESOURCE_EXHAUSTED, before it is parsed. 0: no limit.
    int64_t max_inflight_request_bytes = 0;
    // The largest answer sent (the server's send limit, --max-message-bytes). 0: no limit.
    int64_t max_response_bytes = 0;
  };

  InferenceServiceImpl(InferenceService* core, const ModelRepository* repository, Options options)
      : core_(core), repository_(repository), options_(options) {}

  grpc::ServerUnaryReactor* Classify(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Tag(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx, const serving::v1::ListModelsRequest* request,
                                       serving::v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* ctx, const serving::v1::GetModelRequest* request,
                                     serving::v1::GetModelResponse* response) override;

 private:
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Infer(Method method, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response);

  class Call;  // the reactor of one Classify or Tag call

  // What the access log and the metrics keep of an answer.
  struct AnswerSummary {
    int64_t version = 0;
    int64_t tokens = 0;
    absl::Duration queue, compute;
  };
  // Counts and logs one finished call.
  void Record(Method method, const std::string& peer, const std::string& model, const std::string& request_id,
              int64_t texts, const grpc::Status& status, absl::Time start, const AnswerSummary* answer) const;

  InferenceService* core_;
  const ModelRepository* repository_;
  const Options options_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> inflight_bytes_{0};
};

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_INFERENCE_SERVICE_IMPL_H_

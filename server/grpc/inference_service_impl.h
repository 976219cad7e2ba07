// The gRPC adapter: qvi.serving.v1.Inference on the callback API, over the core InferenceService.
//
// Each method does the same few things and nothing else: convert the request, turn the deadline
// and cancellation into the core's terms, hand the work to the core, convert the answer and the
// status once, and log the access line. No reactor callback blocks: Classify and Tag finish from
// the core's executor thread; ListModels and GetModel only read the repository's state.
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

  // Counts and logs one answered call.
  void Record(Method method, const std::string& peer, const std::string& model, const std::string& request_id,
              int64_t texts, const grpc::Status& status, absl::Time start, const InferenceResponse* response) const;

  InferenceService* core_;
  const ModelRepository* repository_;
  const Options options_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> inflight_bytes_{0};
};

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_INFERENCE_SERVICE_IMPL_H_

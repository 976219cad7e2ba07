// The Open Inference Protocol (OIP v2, KServe's and Triton's inference.GRPCInferenceService) on the
// same port as qvi.serving.v1.Inference, over the same core: ModelInfer shares the batch queues,
// the limits, the errors (the same messages), the deadlines, the memory admitted by request bytes,
// the metrics (method="ModelInfer") and the access log of Classify and Tag. oip_convert.h says
// which tensors go in and out.
//
//   ServerLive      true while the process answers.
//   ServerReady     true once the store is loaded, false from the start of a drain (SIGTERM):
//                   the same as grpc.health.v1's overall status.
//   ModelReady      whether the version (empty: any) is READY; NOT_FOUND for unknown models.
//   ServerMetadata  name, version and the extensions ("classification").
//   ModelMetadata   the ready versions, the platform (qvi_torchscript / qvi_pt2), the input and
//                   outputs, and the manifest's facts as properties.
//   ModelInfer      a Classify (classifiers) or a Tag (taggers) call, chosen by the model's task.
// Versions are strings, as OIP has them: "" is the newest ready version, else a positive integer.
#ifndef QVI_SERVER_GRPC_OIP_SERVICE_H_
#define QVI_SERVER_GRPC_OIP_SERVICE_H_

#include <atomic>

#include "inference/open_inference_grpc.grpc.pb.h"
#include "server/core/serving/inference_service.h"
#include "server/core/serving/model_repository.h"
#include "server/grpc/infer_call.h"

namespace qvi {

// ModelInfer is taken as raw bytes: its bytes count against the in-flight limit before it is parsed.
using OipBase =
    inference::GRPCInferenceService::WithRawCallbackMethod_ModelInfer<inference::GRPCInferenceService::CallbackService>;

class OipServiceImpl final : public OipBase {
 public:
  // `ready` is read by ServerReady; `calls` is shared with qvi.serving.v1.Inference.
  OipServiceImpl(InferenceService* core, const ModelRepository* repository, InferCalls* calls,
                 const std::atomic<bool>* ready)
      : core_(core), repository_(repository), calls_(calls), ready_(ready) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx, const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx, const inference::ServerReadyRequest* request,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx, const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest* request,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;

 private:
  // INVALID_ARGUMENT when `name` is longer than the server takes.

  InferenceService* core_;
  const ModelRepository* repository_;
  InferCalls* calls_;
  const std::atomic<bool>* ready_;
};

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_OIP_SERVICE_H_

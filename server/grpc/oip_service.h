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
#include "server/grpc/oip_convert.h"
#include "server/grpc/wire_scan.h"

namespace qvi {

// Every method is taken as raw bytes, walked on the wire and bounded before it is parsed (wire_scan.h);
// ModelInfer's bytes count against the in-flight limit before that.
namespace oip_base {
using S = inference::GRPCInferenceService;
using OipBase = S::WithRawCallbackMethod_ModelInfer<
    S::WithRawCallbackMethod_ServerLive<S::WithRawCallbackMethod_ServerReady<S::WithRawCallbackMethod_ModelReady<
        S::WithRawCallbackMethod_ServerMetadata<S::WithRawCallbackMethod_ModelMetadata<S::CallbackService>>>>>>;
}  // namespace oip_base
using oip_base::OipBase;

class OipServiceImpl final : public OipBase {
 public:
  // `ready` is read by ServerReady; `calls` is shared with qvi.serving.v1.Inference.
  OipServiceImpl(InferenceService* core, const ModelRepository* repository, InferCalls* calls,
                 const std::atomic<bool>* ready)
      : core_(core), repository_(repository), calls_(calls), ready_(ready), caps_(DefaultWireCaps(core->limits())) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;

  // The answers of ModelReady, ModelMetadata and ServerMetadata, for KServe v2's REST routes too.
  absl::Status ModelReady(const inference::ModelReadyRequest& request, inference::ModelReadyResponse* response) const;
  absl::Status ModelMetadata(const inference::ModelMetadataRequest& request,
                             inference::ModelMetadataResponse* response) const;
  static void ServerMetadata(inference::ServerMetadataResponse* response);

  // A ModelInfer request checked against the version it resolves to: that version, and the plan
  // of the call (oip_convert.h), whose `request` the caller hands to the core. The request's
  // estimate_response_bytes reads the plan: the caller keeps `plan` until the core has answered.
  struct Planned {
    ServableHandle servable;
    std::shared_ptr<oip::InferPlan> plan;
  };
  absl::StatusOr<Planned> Plan(const inference::ModelInferRequest& request) const;
  // The exact size of the answer checked against the send limit, then the answer built.
  absl::Status BuildAnswer(const InferenceResponse& answer, const oip::InferPlan& plan, const std::string& id,
                           inference::ModelInferResponse* response) const;

 private:
  InferenceService* core_;
  const ModelRepository* repository_;
  InferCalls* calls_;
  const std::atomic<bool>* ready_;
  const WireCaps caps_;
};

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_OIP_SERVICE_H_

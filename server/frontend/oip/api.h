// The Open Inference Protocol (OIP v2, KServe's and Triton's inference.GRPCInferenceService) in the
// core's terms, whatever carries it (gRPC, or KServe v2 REST's JSON): ModelInfer planned against one
// version and answered as tensors (tensors.h), and the answers of the calls that only read the
// server's state. The transports: server/grpc/oip/oip_service.h, server/http/kserve/.
//
//   ServerReady     true once the store is loaded, false from the start of a drain (SIGTERM).
//   ModelReady      whether the version (empty: any) is READY; NOT_FOUND for unknown models.
//   ServerMetadata  name, version and the extensions ("classification").
//   ModelMetadata   the ready versions, the platform (qvi_torchscript / qvi_pt2), the input and
//                   outputs, and the manifest's facts as properties.
//   ModelInfer      a Classify (classifiers) or a Tag (taggers) call, chosen by the model's task.
// Versions are strings, as OIP has them: "" is the newest ready version, else a positive integer.
#ifndef QVI_SERVER_FRONTEND_OIP_API_H_
#define QVI_SERVER_FRONTEND_OIP_API_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference/open_inference_grpc.pb.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request_checks.h"
#include "server/frontend/call.h"
#include "server/frontend/oip/tensors.h"

namespace qvi {

class OipApi {
 public:
  // `ready` is the server's readiness (false from the start of a drain); `calls` gives the send limit.
  OipApi(const ModelRepository* repository, const RequestLimits& limits, const Calls* calls,
         const std::atomic<bool>* ready)
      : repository_(repository), limits_(limits), calls_(calls), ready_(ready) {}

  bool ServerReady() const { return ready_->load(); }
  absl::Status ModelReady(const inference::ModelReadyRequest& request, inference::ModelReadyResponse* response) const;
  absl::Status ModelMetadata(const inference::ModelMetadataRequest& request,
                             inference::ModelMetadataResponse* response) const;
  static void ServerMetadata(inference::ServerMetadataResponse* response);

  // A ModelInfer request checked against the version it resolves to: that version, and the plan
  // of the call (tensors.h), whose `request` the caller hands to the core. The request's
  // estimate_response_bytes reads the plan: the caller keeps `plan` until the core has answered.
  struct Planned {
    ServableHandle servable;
    std::shared_ptr<oip::InferPlan> plan;
  };
  // `loaded`: what a load on demand made READY for the request; it serves it when it is the version asked for.
  absl::StatusOr<Planned> Plan(const inference::ModelInferRequest& request,
                               const ServableHandle& loaded = nullptr) const;
  // The exact size of the answer checked against the send limit, then the answer built.
  absl::Status BuildAnswer(const InferenceResponse& answer, const oip::InferPlan& plan, const std::string& id,
                           inference::ModelInferResponse* response) const;

 private:
  const ModelRepository* repository_;
  const RequestLimits limits_;
  const Calls* calls_;
  const std::atomic<bool>* ready_;
};

}  // namespace qvi

#endif  // QVI_SERVER_FRONTEND_OIP_API_H_

// The Open Inference Protocol over gRPC (inference.GRPCInferenceService), on the same port as
// qvi.serving.v1.Inference, over the same core: a thin adapter of OipApi (server/frontend/oip/api.h,
// which says what each method answers). ModelInfer shares the batch queues, the limits, the errors,
// the deadlines, the memory admitted by request bytes, the metrics (method="ModelInfer") and the
// access log of Classify and Tag through the frontend's Call.
#ifndef QVI_SERVER_GRPC_OIP_OIP_SERVICE_H_
#define QVI_SERVER_GRPC_OIP_OIP_SERVICE_H_

#include "inference/open_inference_grpc.grpc.pb.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/frontend/oip/api.h"
#include "server/grpc/wire/wire_scan.h"

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
  // `calls` is shared with every other front end.
  OipServiceImpl(Core* core, const OipApi* api, Calls* calls)
      : core_(core), api_(api), calls_(calls), caps_(DefaultWireCaps(core->limits())) {}

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

 private:
  Core* core_;
  const OipApi* api_;
  Calls* calls_;
  const WireCaps caps_;
};

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_OIP_OIP_SERVICE_H_

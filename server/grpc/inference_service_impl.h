// The gRPC adapter: qvi.serving.v1.Inference on the callback API, over the core InferenceService.
//
// Each method does the same few things and nothing else: convert the request, turn the deadline
// and cancellation into the core's terms, hand the work to the core, convert the answer and the
// status once, and log the access line. No reactor callback blocks: Classify and Tag finish from
// the core's executor thread; ListModels and GetModel only read the repository's state.
//
// Classify and Tag are counted (metrics, access log) when gRPC says the call is over (see
// infer_call.h). An answer larger than the send limit is not sent: the client gets
// RESOURCE_EXHAUSTED saying so. Nothing on the answer path may throw into gRPC: a failure while
// building the answer (std::bad_alloc, say) answers that call with INTERNAL.
#ifndef QVI_SERVER_GRPC_INFERENCE_SERVICE_IMPL_H_
#define QVI_SERVER_GRPC_INFERENCE_SERVICE_IMPL_H_

#include "qvi/serving/v1/inference.grpc.pb.h"
#include "server/core/serving/inference_service.h"
#include "server/core/serving/model_repository.h"
#include "server/grpc/infer_call.h"
#include "server/grpc/wire_scan.h"

namespace qvi {

// Every method is taken as raw bytes: the request is walked on the wire and bounded before it is
// parsed (wire_scan.h), and a request that does not decode is INVALID_ARGUMENT naming the field
// (texts[i] that is not UTF-8, say) rather than an opaque failure. Classify's and Tag's bytes count
// against the in-flight limit before that.
using InferenceBase = serving::v1::Inference::WithRawCallbackMethod_Classify<
    serving::v1::Inference::WithRawCallbackMethod_Tag<serving::v1::Inference::WithRawCallbackMethod_ListModels<
        serving::v1::Inference::WithRawCallbackMethod_GetModel<serving::v1::Inference::CallbackService>>>>;

class InferenceServiceImpl final : public InferenceBase {
 public:
  // `calls` is shared with the other inference API (memory admitted by bytes, counting).
  InferenceServiceImpl(InferenceService* core, const ModelRepository* repository, InferCalls* calls)
      : core_(core), repository_(repository), calls_(calls), caps_(DefaultWireCaps(core->limits())) {}

  grpc::ServerUnaryReactor* Classify(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Tag(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  // GetModel's answer, for the HTTP route too.
  absl::Status GetModel(const serving::v1::GetModelRequest& request, serving::v1::GetModelResponse* response) const;

 private:
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Infer(Method method, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response);

  InferenceService* core_;
  const ModelRepository* repository_;
  InferCalls* calls_;
  const WireCaps caps_;
};

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_INFERENCE_SERVICE_IMPL_H_

// qvi.serving.v1.Inference over gRPC's callback API: a thin adapter that decodes the request,
// hands it to the core through the frontend's Call (server/grpc/infer_call.h) and encodes the
// native API's answer (server/frontend/native/api.h). No reactor callback blocks: Classify and Tag
// finish from the core's threads; ListModels and GetModel only read the repository's state.
#ifndef QVI_SERVER_GRPC_NATIVE_NATIVE_SERVICE_H_
#define QVI_SERVER_GRPC_NATIVE_NATIVE_SERVICE_H_

#include "qvi/serving/v1/inference.grpc.pb.h"
#include "server/core/repository/model_repository.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/grpc/infer_stream.h"
#include "server/grpc/wire/wire_scan.h"

namespace qvi {

// Every method is taken as raw bytes: the request is walked on the wire and bounded before it is
// parsed (wire_scan.h), and a request that does not decode is INVALID_ARGUMENT naming the field
// (texts[i] that is not UTF-8, say) rather than an opaque failure. Classify's and Tag's bytes count
// against the in-flight limit before that.
// ClassifyStream and TagStream are InferStreams (server/grpc/infer_stream.h) of the same requests. On
// Inference::Service, every method made a raw callback one: CallbackService's typed stream methods
// would clash with the raw ones (the same parameters, another return type).
using InferenceBase = serving::v1::Inference::WithRawCallbackMethod_Classify<
    serving::v1::Inference::WithRawCallbackMethod_Tag<serving::v1::Inference::WithRawCallbackMethod_ClassifyStream<
        serving::v1::Inference::WithRawCallbackMethod_TagStream<
            serving::v1::Inference::WithRawCallbackMethod_ListModels<
                serving::v1::Inference::WithRawCallbackMethod_GetModel<serving::v1::Inference::Service>>>>>>;

using RawStreamReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

class InferenceServiceImpl final : public InferenceBase {
 public:
  // `calls` is shared with every other front end (memory admitted by bytes, counting).
  // `max_stream_inflight`: a stream's requests read and not yet answered, at most (--max-stream-inflight).
  InferenceServiceImpl(Core* core, const ModelRepository* repository, Calls* calls,
                       int max_stream_inflight = kDefaultMaxStreamInflight)
      : core_(core),
        repository_(repository),
        calls_(calls),
        caps_(DefaultWireCaps(core->limits())),
        max_stream_inflight_(max_stream_inflight) {}

  grpc::ServerUnaryReactor* Classify(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Tag(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                grpc::ByteBuffer* response) override;
  RawStreamReactor* ClassifyStream(grpc::CallbackServerContext* ctx) override;
  RawStreamReactor* TagStream(grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;

 private:
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Infer(Method method, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response);
  template <typename Request, typename StreamResponse>
  RawStreamReactor* Stream(Method method, grpc::CallbackServerContext* ctx);

  Core* core_;
  const ModelRepository* repository_;
  Calls* calls_;
  const WireCaps caps_;
  const int max_stream_inflight_;
};

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_NATIVE_NATIVE_SERVICE_H_

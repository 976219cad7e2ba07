// Text Embeddings Inference's gRPC API (tei.v1, proto/tei/v1/tei.proto, vendored) on the gRPC port beside
// qvi.serving.v1 and OIP, for a classifier (docs/serving.md, "Drop-in routes"):
//   tei.v1.Info/Info             the model, its limits (MODEL_TYPE_CLASSIFIER; a tagger is refused: TEI has no
//                                type for it)
//   tei.v1.Predict/Predict       every label with its score, best first, and TEI's Metadata (characters, tokens,
//                                times); `truncate` is read as TEI's gRPC reads it, literally (false: a text over
//                                the model's max_tokens is refused)
//   tei.v1.Tokenize/Tokenize     the text's tokens (frontend/tei/tokens.h), byte offsets
//   tei.v1.Tokenize/Decode       ids back to text
// The model: the `qvi-model` metadata's, else --default-model, else the store's only one (frontend/drop_in_model.h).
// Predict, Tokenize and Decode run through the call layer as every call does (API keys, limits, deadlines,
// metrics as "TeiPredict", "TeiTokenize", "TeiDecode"); Info is read as GetModel is (the read scope). Every
// request is walked on the wire before it is parsed (wire_scan.h).
//   tei.v1.Predict/PredictStream, tei.v1.Tokenize/TokenizeStream and /DecodeStream: the same requests as a stream,
//                                answered in order; the first that fails ends the stream with its status, as
//                                TEI's do (infer_stream.h); each request a call of its own ("TeiPredictStream", ...),
//                                at most --max-stream-inflight of a stream read and not yet answered
// Not built: PredictPair (text pairs), Embed and Rerank (UNIMPLEMENTED, as gRPC answers an RPC not served).
#ifndef QVI_SERVER_GRPC_TEI_TEI_SERVICE_H_
#define QVI_SERVER_GRPC_TEI_TEI_SERVICE_H_

#include <string>

#include "server/core/repository/model_repository.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/grpc/native/native_service.h"
#include "server/grpc/wire/wire_scan.h"
#include "tei/v1/tei.grpc.pb.h"

namespace qvi {

// What the three services share.
struct TeiGrpc {
  Core* core;
  Calls* calls;
  const ModelRepository* repository;
  std::string default_model;
  WireCaps caps;
  int max_stream_inflight;  // --max-stream-inflight
};

class TeiInfoService final : public tei::v1::Info::WithRawCallbackMethod_Info<tei::v1::Info::CallbackService> {
 public:
  explicit TeiInfoService(const TeiGrpc* tei) : tei_(tei) {}
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;

 private:
  const TeiGrpc* tei_;
};

class TeiPredictService final
    : public tei::v1::Predict::WithRawCallbackMethod_Predict<
          tei::v1::Predict::WithRawCallbackMethod_PredictStream<tei::v1::Predict::WithCallbackMethod_PredictPair<
              tei::v1::Predict::WithCallbackMethod_PredictPairStream<tei::v1::Predict::Service>>>> {
 public:
  explicit TeiPredictService(const TeiGrpc* tei) : tei_(tei) {}
  grpc::ServerUnaryReactor* Predict(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  RawStreamReactor* PredictStream(grpc::CallbackServerContext* ctx) override;

 private:
  const TeiGrpc* tei_;
};

class TeiTokenizeService final
    : public tei::v1::Tokenize::WithRawCallbackMethod_Tokenize<
          tei::v1::Tokenize::WithRawCallbackMethod_Decode<tei::v1::Tokenize::WithRawCallbackMethod_TokenizeStream<
              tei::v1::Tokenize::WithRawCallbackMethod_DecodeStream<tei::v1::Tokenize::Service>>>> {
 public:
  explicit TeiTokenizeService(const TeiGrpc* tei) : tei_(tei) {}
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Decode(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  RawStreamReactor* TokenizeStream(grpc::CallbackServerContext* ctx) override;
  RawStreamReactor* DecodeStream(grpc::CallbackServerContext* ctx) override;

 private:
  const TeiGrpc* tei_;
};

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_TEI_TEI_SERVICE_H_

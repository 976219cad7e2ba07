// A unary RPC taken as raw bytes, so that its request is walked on the wire before it is parsed
// (wire_scan.h) and a request that does not decode is answered INVALID_ARGUMENT with the reason,
// never gRPC's bare UNIMPLEMENTED for a message it could not deserialise.
#ifndef QVI_SERVER_GRPC_RAW_UNARY_H_
#define QVI_SERVER_GRPC_RAW_UNARY_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/base/exception_text.h"
#include "server/grpc/infer_call.h"
#include "server/grpc/status.h"
#include "server/grpc/wire/wire_scan.h"

namespace qvi {

// With `allowed` OK (the caller's key has the call's scope, Calls::Authorize): decodes a Request from
// `raw`, runs `handle(request, &response)` (an absl::Status), and answers with the serialised Response
// or the error; else answers `allowed` without decoding anything. Nothing throws into gRPC: a failure
// (std::bad_alloc, say) is INTERNAL for this call alone.
template <typename Request, typename Response, typename Handle>
grpc::ServerUnaryReactor* RawUnary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                   grpc::ByteBuffer* raw_response, const WireCaps& caps, const absl::Status& allowed,
                                   Handle&& handle) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::Status status;
  try {
    Request request;
    Response response;
    absl::Status s = allowed;
    if (!s.ok()) AddRetryPushback(ctx, s);
    if (s.ok()) s = DecodeRequest(*raw, caps, &request);
    if (s.ok()) s = handle(request, &response);
    status = ToGrpcStatus(s);
    if (status.ok()) {
      bool own = false;
      status = grpc::SerializationTraits<Response>::Serialize(response, raw_response, &own);
    }
  } catch (...) {
    status = grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("answering failed: ", CurrentExceptionText()));
  }
  reactor->Finish(status);
  return reactor;
}

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_RAW_UNARY_H_

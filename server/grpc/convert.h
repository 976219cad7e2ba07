// Conversions between the public API (qvi.serving.v1) and the core's types, and the one place
// where an absl::Status becomes a grpc::Status.
#ifndef QVI_SERVER_GRPC_CONVERT_H_
#define QVI_SERVER_GRPC_CONVERT_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "qvi/serving/v1/inference.pb.h"
#include "server/core/serving/model_repository.h"
#include "server/core/spec/request.h"
#include "server/grpc/request_from_proto.h"

namespace qvi {

namespace v1 = ::qvi::serving::v1;

grpc::Status ToGrpcStatus(const absl::Status& status);
// "OK", "INVALID_ARGUMENT", ...: gRPC's and absl's codes are the same numbers and names.
std::string StatusCodeName(grpc::StatusCode code);

void ToProto(const InferenceResponse& in, v1::ClassifyResponse* out);
void ToProto(const InferenceResponse& in, v1::TagResponse* out);
void ToProto(const ModelStatus& in, v1::ModelInfo* out);
// The catalogue outputs the native API carries as Token or LayerMap fields (for the test that every
// catalogue row with an answer field has one).
std::vector<Output> OutputsWithProtoFields();

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_CONVERT_H_

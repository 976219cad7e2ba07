// The one place where an absl::Status becomes a grpc::Status.
#ifndef QVI_SERVER_GRPC_STATUS_H_
#define QVI_SERVER_GRPC_STATUS_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"

namespace qvi {

// absl::StatusCode and grpc::StatusCode share their numbering (both follow google.rpc.Code).
inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_STATUS_H_

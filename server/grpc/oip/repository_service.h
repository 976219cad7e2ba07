// OIP's model-repository extension over gRPC (server/frontend/oip/repository.h): the methods
// /inference.GRPCInferenceService/RepositoryIndex, /RepositoryModelLoad and /RepositoryModelUnload,
// which tritonclient calls and the vendored OIP definition lacks, served by name as a generic service
// (gRPC hands it every method no registered service has). Each is unary: one request, walked on the
// wire before it is parsed (wire_scan.h), and one answer; a load's answer is sent from the poll worker
// that finished it, so no gRPC thread waits for a load. Every other unknown method is UNIMPLEMENTED
// naming it. The caller's key needs the `admin` scope; each control is logged with the key's name.
#ifndef QVI_SERVER_GRPC_OIP_REPOSITORY_SERVICE_H_
#define QVI_SERVER_GRPC_OIP_REPOSITORY_SERVICE_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include "server/frontend/call.h"
#include "server/frontend/oip/repository.h"
#include "server/grpc/wire/wire_scan.h"

namespace qvi {

class RepositoryService final : public grpc::CallbackGenericService {
 public:
  RepositoryService(const OipRepository* repository, const Calls* calls, const WireCaps& caps)
      : repository_(repository), calls_(calls), caps_(caps) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

  // Answers the request `raw` of `method` through `answer` (once; maybe from another thread).
  using Answer = std::function<void(const absl::Status&, grpc::ByteBuffer)>;
  void Handle(grpc::GenericCallbackServerContext* ctx, const grpc::ByteBuffer& raw, Answer answer) const;

 private:
  const OipRepository* repository_;
  const Calls* calls_;
  const WireCaps caps_;
};

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_OIP_REPOSITORY_SERVICE_H_

// gRPC server reflection (grpc.reflection.v1, and v1alpha, the name older clients ask), answered by
// the server itself instead of gRPC's reflection plugin. The plugin parses each message of the stream
// as it comes and echoes it back whole in `original_request`: four 16 MiB messages of unknown fields
// grew the server by ~300 MiB, each answer was another 16 MiB. Here each message is held to
// kMaxReflectionRequestBytes (a file or symbol name never comes near), walked on the wire like every
// other request (wire_scan.h), and only then parsed; a message over the cap or that does not decode
// ends the stream with INVALID_ARGUMENT saying why.
//
// The answers are the descriptors linked into the process (protobuf's generated pool): a file by name,
// the file that defines a symbol or an extension, the extension numbers of a type, and the services
// this server registered. A file is sent with those of its dependencies not yet sent on the stream, as
// the protocol allows; what is not found is an error_response (NOT_FOUND) and the stream goes on.
#ifndef QVI_SERVER_GRPC_REFLECTION_SERVICE_H_
#define QVI_SERVER_GRPC_REFLECTION_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "server/grpc/wire/wire_scan.h"

namespace qvi {

// Bytes of one ServerReflectionRequest.
inline constexpr size_t kMaxReflectionRequestBytes = 64 << 10;

// One reflection service, for the generated service class `Generated` of either version and its messages.
template <typename Generated, typename Request, typename Response>
class ReflectionService final
    : public Generated::template WithRawCallbackMethod_ServerReflectionInfo<typename Generated::Service> {
 public:
  // `services`: the full names of the services the server registered, listed by list_services.
  explicit ReflectionService(std::vector<std::string> services);

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ServerReflectionInfo(
      grpc::CallbackServerContext* ctx) override;

 private:
  const std::vector<std::string> services_;
  const WireCaps caps_;
};

namespace reflection_v1 = grpc::reflection::v1;
namespace reflection_v1alpha = grpc::reflection::v1alpha;
using ReflectionV1 = ReflectionService<reflection_v1::ServerReflection, reflection_v1::ServerReflectionRequest,
                                       reflection_v1::ServerReflectionResponse>;
using ReflectionV1Alpha =
    ReflectionService<reflection_v1alpha::ServerReflection, reflection_v1alpha::ServerReflectionRequest,
                      reflection_v1alpha::ServerReflectionResponse>;

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_REFLECTION_SERVICE_H_

// A message as protobuf's canonical JSON, written straight from its fields by reflection: the same
// bytes as MessageToJsonString with always_print_primitive_fields (a test compares them on random
// messages), without its binary round trip and type resolver, which cost a quarter of the server's CPU
// per HTTP/JSON call (docs/performance.md, "The cost of serving itself").
#ifndef QVI_SERVER_HTTP_NATIVE_PROTO_JSON_H_
#define QVI_SERVER_HTTP_NATIVE_PROTO_JSON_H_

#include <google/protobuf/message.h>

#include <string>

namespace qvi {

// False (and `out` unspecified) for a message with a map field, which this writer leaves to protobuf.
bool WriteProtoJson(const google::protobuf::Message& message, std::string* out);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_NATIVE_PROTO_JSON_H_

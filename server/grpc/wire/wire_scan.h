// Every request is walked on the wire before protobuf parses it, so that what parsing would build is
// bounded first. Protobuf makes one heap object per element of a repeated field (and per unknown
// field), and an empty element is 2 bytes on the wire: a 16 MiB message of empty `texts` or `inputs`
// once cost the server 100 times its size in memory before any check looked at it. The walk reads
// the bytes with protobuf's own wire readers (CodedInputStream), allocates nothing per element, and
// refuses, with INVALID_ARGUMENT naming the field and the cap:
//   - more elements of one repeated field (map entries and packed scalars included) in the whole
//     request than its cap ("texts: 300 texts exceed the limit of 256 per request", as the checks
//     after parsing word it);
//   - more unknown fields (numbers this server's schema lacks) than a small cap, and groups;
//   - a string field that is not UTF-8 (named with its index: "texts[3]: ..."), which protobuf
//     would otherwise refuse with a bare failure and a line on stderr;
//   - a truncated or malformed message, saying where.
// What passes is parsed; parsing it then holds at most a few times its wire size plus the caps'
// elements (see docs/security.md).
#ifndef QVI_SERVER_GRPC_WIRE_WIRE_SCAN_H_
#define QVI_SERVER_GRPC_WIRE_WIRE_SCAN_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/zero_copy_stream.h>
#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "server/core/request/request_checks.h"

namespace qvi {

struct WireCaps {
  struct Cap {
    int elements = 0;
    std::string unit;  // what the elements are, for the message ("texts"); empty: the field's name
  };
  // Elements of one repeated field in a whole request, for fields `fields` does not name.
  int repeated = 64;
  // By the field's full name ("qvi.serving.v1.ClassifyRequest.texts").
  absl::flat_hash_map<std::string, Cap> fields;
  // Fields whose numbers the schema does not have, in a whole request (their values are skipped).
  int unknown_fields = 64;
};

// The caps the server applies: texts and bytes_contents at limits.max_texts, the other repeated
// fields of the two APIs at small counts no real client reaches (docs/security.md lists them).
WireCaps DefaultWireCaps(const RequestLimits& limits);

// Walks one serialised message of type `type` read from `in`. OK, or INVALID_ARGUMENT saying why.
absl::Status ScanWire(const google::protobuf::Descriptor& type, google::protobuf::io::ZeroCopyInputStream* in,
                      const WireCaps& caps);

// ScanWire, then parses into `out`. The error messages name `out`'s type and the field.
absl::Status DecodeRequest(const grpc::ByteBuffer& raw, const WireCaps& caps, google::protobuf::Message* out);
absl::Status DecodeRequest(const void* data, size_t size, const WireCaps& caps, google::protobuf::Message* out);

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_WIRE_WIRE_SCAN_H_

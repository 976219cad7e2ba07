// The scalar half of the JSON bodies' decoding (json_body.cc): one JSON value that is not an object or
// a list, put into a protobuf field by protobuf's JSON mapping, or named for an error. Internal to
// server/http/native/.
#ifndef QVI_SERVER_HTTP_NATIVE_JSON_VALUES_H_
#define QVI_SERVER_HTTP_NATIVE_JSON_VALUES_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cstdint>
#include <string>

namespace qvi::json_body {

// One JSON value that is not an object or a list, as the parser read it.
struct Scalar {
  enum Kind { kNull, kBool, kSigned, kUnsigned, kFloat, kString } kind = kNull;
  bool boolean = false;
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  // kString: the string; kFloat: the number as written. Copied into the message, not moved: the parser
  // then keeps its buffer's capacity for the next string (a quarter of the allocations at 32 texts).
  const std::string* text = nullptr;
};

// Puts `v` into field `f` of `m` (appends it when `add`); false when `v` is not a value of f's type.
bool Assign(google::protobuf::Message* m, const google::protobuf::FieldDescriptor* f, bool add, const Scalar& v);

// What a value of `f` is, for errors: "a list of int32", "an object (OutputOptions)", "a TruncationPolicy".
std::string Expected(const google::protobuf::FieldDescriptor* f, bool in_list);

}  // namespace qvi::json_body

#endif  // QVI_SERVER_HTTP_NATIVE_JSON_VALUES_H_

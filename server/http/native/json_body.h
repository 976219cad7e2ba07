// A request body's JSON, decoded with its cost bounded before the work: ScanBody walks the bytes
// once without building anything and refuses malformed JSON (named by byte), invalid UTF-8 or lone
// surrogates, nesting deeper than 16, more texts than a request may hold (a Classify or Tag body's
// "texts") and more JSON values than any request of that many texts needs (4 per text, plus 1024);
// ParseBody scans a body and builds a proto message from it in the same pass, in protobuf's JSON
// mapping. Torch-free, so that the fuzz target fuzz_http_json builds it alone.
#ifndef QVI_SERVER_HTTP_NATIVE_JSON_BODY_H_
#define QVI_SERVER_HTTP_NATIVE_JSON_BODY_H_

#include <google/protobuf/message.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace qvi {

// OK, or INVALID_ARGUMENT naming what was wrong and where ("request body: ...", "texts: ...").
absl::Status ScanBody(std::string_view body, int max_texts);

// The body as `message`, scanned as ScanBody does while it is read: INVALID_ARGUMENT names the field,
// the value and what the field takes. The message protobuf's JsonStringToMessage makes of the body,
// where both accept it; refused besides: a field given twice, null in a list, enums as quoted numbers.
// Messages with maps, bytes, oneofs or well-known types go to JsonStringToMessage after the scan.
absl::Status ParseBody(const std::string& body, int max_texts, google::protobuf::Message* message);

// At most `max` bytes of `s` (cut on a UTF-8 character's boundary, "..." added when cut): what an
// error quotes of a client's input.
std::string Clip(const std::string& s, size_t max);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_NATIVE_JSON_BODY_H_

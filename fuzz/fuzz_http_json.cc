// An HTTP request body (server/http/native/json_body.h, kserve_rest.h), whatever its bytes: the scan refuses
// it with a bounded message or lets it through, and a body it lets through parses (or is refused,
// with a bounded message) as a Classify request in protobuf's JSON mapping -- into the message
// protobuf's own converter makes of it -- and as a KServe v2
// inference request, never holding more texts than the limit. Bytes after a NUL are the body's binary part
// (the binary-data extension): the inputs' raw contents never hold more than those bytes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <google/protobuf/util/json_util.h>

#include "nlohmann/json.hpp"
#include "qvi/serving/v1/inference.pb.h"
#include "server/http/kserve/kserve_rest.h"
#include "server/http/native/json_body.h"

namespace {
#define Check(ok)                                                         \
  do {                                                                    \
    if (!(ok)) {                                                          \
      std::fprintf(stderr, "check failed, line %d: %s\n", __LINE__, #ok); \
      std::abort();                                                       \
    }                                                                     \
  } while (false)
constexpr int kMaxTexts = 8;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string body = input.substr(0, nul);
  const std::string binary = nul == std::string::npos ? "" : input.substr(nul + 1);
  if (absl::Status s = qvi::ScanBody(body, kMaxTexts); !s.ok()) {
    Check(s.code() == absl::StatusCode::kInvalidArgument && s.message().size() < 600);
    return 0;
  }
  qvi::serving::v1::ClassifyRequest classify;
  if (absl::Status s = qvi::ParseBody(body, kMaxTexts, &classify); s.ok()) {
    Check(classify.texts_size() <= kMaxTexts);
    // What the one walk reads, protobuf's own converter reads the same (it may refuse less).
    qvi::serving::v1::ClassifyRequest theirs;
    Check(google::protobuf::util::JsonStringToMessage(body, &theirs).ok());
    Check(theirs.SerializeAsString() == classify.SerializeAsString());
  } else {
    Check(s.code() == absl::StatusCode::kInvalidArgument && s.message().size() < 600);
  }
  const nlohmann::json parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  Check(!parsed.is_discarded());  // the scan let only well-formed JSON through
  absl::StatusOr<qvi::rest::ParsedInfer> infer = qvi::rest::InferRequest(parsed, "m", "", binary);
  if (infer.ok()) {
    size_t raw = 0;
    for (const auto& input : infer->request.inputs()) {
      Check(input.contents().bytes_contents_size() <= 4 * kMaxTexts + 1024);
    }
    for (const std::string& r : infer->request.raw_input_contents()) raw += r.size();
    Check(raw == binary.size());  // every binary byte is an input's, or the request is refused
  } else {
    Check(infer.status().code() == absl::StatusCode::kInvalidArgument && infer.status().message().size() < 600);
  }
  return 0;
}

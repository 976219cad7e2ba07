// A whole Classify request from the wire: the bytes parsed as a ClassifyRequest (as the server's
// raw handler does), turned into the core's request, and checked against the limits and the layer
// and head indices (against a model of 2 layers x 4 heads). Whatever the bytes, the check answers
// OK or INVALID_ARGUMENT with a message of bounded length, never echoing unbounded client input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/core/spec/request_checks.h"
#include "server/grpc/request_from_proto.h"

namespace {
void Check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qvi::v1::ClassifyRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const qvi::InferenceRequest r =
      qvi::FromProto(request.model(), request.texts(), request.options(), request.request_id());
  qvi::RequestLimits limits;
  limits.max_texts = 8;
  limits.max_text_bytes = 512;
  absl::Status s = qvi::CheckRequest(r, limits);
  if (s.ok()) s = qvi::CheckIndices("options.layers.layers", r.options.layers.layers, 2, "layers");
  if (s.ok()) s = qvi::CheckIndices("options.layers.heads", r.options.layers.heads, 4, "heads");
  if (!s.ok()) {
    Check(s.code() == absl::StatusCode::kInvalidArgument);
    Check(s.message().size() < 400);
  } else {
    Check(!r.model.empty() && r.texts.size() <= 8);
  }
  const std::string capped = qvi::Capped(r.model);
  Check(capped.size() <= 64 + 32);
  return 0;
}

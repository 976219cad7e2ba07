// A whole Classify request from the wire: the bytes walked and parsed as a ClassifyRequest (as the
// server's raw handler does, server/grpc/wire/wire_scan.h), which must refuse with a bounded message or
// hold at most 4 times the wire size plus the caps' elements (SpaceUsedLong); then turned into the
// core's request, and checked against the limits and the layer
// and head indices (against a model of 2 layers x 4 heads). Whatever the bytes, the check answers
// OK or INVALID_ARGUMENT with a message of bounded length, never echoing unbounded client input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/core/request/request_checks.h"
#include "server/frontend/native/request.h"
#include "server/grpc/wire/wire_scan.h"

namespace {
void Check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qvi::RequestLimits limits;
  limits.max_texts = 8;
  limits.max_text_bytes = 512;
  static const qvi::WireCaps caps = qvi::DefaultWireCaps(limits);
  qvi::v1::ClassifyRequest request;
  if (absl::Status d = qvi::DecodeRequest(data, size, caps, &request); !d.ok()) {
    Check(d.code() == absl::StatusCode::kInvalidArgument && d.message().size() < 400);
    return 0;
  }
  Check(request.SpaceUsedLong() <= 4 * size + (64 << 10));
  const qvi::InferenceRequest r =
      qvi::FromProto(request.model(), request.texts(), request.options(), request.request_id());
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

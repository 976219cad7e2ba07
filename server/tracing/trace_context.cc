#include "server/tracing/trace_context.h"

#include "server/tracing/span.h"

namespace qvi {
namespace {

bool LowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool AllZero(std::string_view s) { return s.find_first_not_of('0') == std::string_view::npos; }

}  // namespace

std::optional<TraceParent> ParseTraceParent(std::string_view value) {
  // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters.
  constexpr size_t kLength = 55;
  if (value.size() < kLength) return std::nullopt;
  const std::string_view version = value.substr(0, 2), trace_id = value.substr(3, 32), parent_id = value.substr(36, 16),
                         flags = value.substr(53, 2);
  if (value[2] != '-' || value[35] != '-' || value[52] != '-') return std::nullopt;
  if (!LowerHex(version) || version == "ff" || !LowerHex(trace_id) || !LowerHex(parent_id) || !LowerHex(flags)) {
    return std::nullopt;
  }
  if (AllZero(trace_id) || AllZero(parent_id)) return std::nullopt;
  // Version 00 is exactly 55 characters; a later version may add fields after a '-'.
  if (version == "00" ? value.size() != kLength : value.size() > kLength && value[kLength] != '-') {
    return std::nullopt;
  }
  const int flag_bits = std::stoi(std::string(flags), nullptr, 16);
  return TraceParent{std::string(trace_id), std::string(parent_id), (flag_bits & 1) != 0};
}

std::string Tracer::Draw() const { return Drawn(rate_) ? ToHex(NewTraceId()) : ""; }

}  // namespace qvi

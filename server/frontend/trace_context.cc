#include "server/frontend/trace_context.h"

#include <random>

#include "absl/strings/escaping.h"

namespace qvi {
namespace {

bool LowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool AllZero(std::string_view s) { return s.find_first_not_of('0') == std::string_view::npos; }

std::mt19937_64& Generator() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return generator;
}

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

std::string Tracer::NewTraceId() {
  std::string bytes(16, '\0');
  do {
    for (size_t i = 0; i < bytes.size(); i += 8) {
      const uint64_t r = Generator()();
      for (size_t j = 0; j < 8; ++j) bytes[i + j] = static_cast<char>((r >> (8 * j)) & 0xff);
    }
  } while (bytes == std::string(16, '\0'));
  return absl::BytesToHexString(bytes);
}

std::string Tracer::Draw() const {
  if (rate_ <= 0) return "";
  if (rate_ < 1 && std::uniform_real_distribution<double>(0, 1)(Generator()) >= rate_) return "";
  return NewTraceId();
}

}  // namespace qvi

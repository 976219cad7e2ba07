#include "server/tracing/span.h"

#include <random>

#include "absl/strings/escaping.h"

namespace qvi {

namespace {

std::mt19937_64& Rng() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng;
}

template <size_t N>
std::array<uint8_t, N> RandomId() {
  std::array<uint8_t, N> id{};
  bool zero = true;
  while (zero) {
    for (size_t i = 0; i < N; i += 8) {
      const uint64_t r = Rng()();
      for (size_t b = 0; b < 8 && i + b < N; ++b) id[i + b] = static_cast<uint8_t>(r >> (8 * b));
    }
    for (uint8_t b : id) zero = zero && b == 0;
  }
  return id;
}

template <size_t N>
std::optional<std::array<uint8_t, N>> FromHex(std::string_view hex) {
  if (hex.size() != 2 * N) return std::nullopt;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return std::nullopt;
  }
  const std::string bytes = absl::HexStringToBytes(absl::string_view(hex.data(), hex.size()));
  std::array<uint8_t, N> id{};
  bool zero = true;
  for (size_t i = 0; i < N; ++i) {
    id[i] = static_cast<uint8_t>(bytes[i]);
    zero = zero && id[i] == 0;
  }
  if (zero) return std::nullopt;
  return id;
}

}  // namespace

TraceId NewTraceId() { return RandomId<16>(); }
SpanId NewSpanId() { return RandomId<8>(); }

std::optional<TraceId> TraceIdFromHex(std::string_view hex) { return FromHex<16>(hex); }
std::optional<SpanId> SpanIdFromHex(std::string_view hex) { return FromHex<8>(hex); }

std::string ToHex(const uint8_t* bytes, size_t n) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), n));
}

bool Drawn(double ratio) {
  if (ratio >= 1) return true;
  if (ratio <= 0) return false;
  return std::uniform_real_distribution<double>(0, 1)(Rng()) < ratio;
}

bool SpanSampler::Sample(std::optional<bool> parent_sampled) const {
  if (parent_sampled.has_value()) return *parent_sampled;
  return Drawn(ratio_);
}

}  // namespace qvi

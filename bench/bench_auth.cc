// What an API key costs a call (server/auth/): the check every call of a server with --api-keys makes
// before anything is decoded, and the rate limiter's bucket (Google Benchmark, one thread).
//
//   Authorize/N        ApiKeys::Authorize on a set of N keys: the Bearer header split, SHA-256 of the key
//                      (OpenSSL), the look-up by the hash's first 8 bytes, the constant-time comparison and
//                      the scope check; the keys take turns.
//   Unknown/N          the same for a key the set does not hold (the refusal's cost).
//   TakeRequest/N      RateLimiter::TakeRequest (one requests bucket, never empty here) for N keys with
//                      limits of their own, taking turns: the mutex and the map look-up included.
//   Both/N             Authorize then TakeRequest: what Calls::Authorize adds to a call.
// Run: build/qvi-bench-auth [--benchmark_min_time=0.5]; results and the command are in BENCHMARKS.md ("API
// keys and rate limits").
#include <benchmark/benchmark.h>

#include <openssl/sha.h>

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/auth/api_keys.h"
#include "server/auth/rate_limit.h"

namespace qvi {
namespace {

struct Fixture {
  std::vector<std::string> headers;  // "Bearer key-i"
  std::unique_ptr<ApiKeys> keys;
  std::vector<RateLimiter::Who> who;
};

Fixture Make(int n) {
  Fixture f;
  std::string json = R"({"keys": [)";
  for (int i = 0; i < n; ++i) {
    const std::string key = absl::StrCat("bench-key-", i, "-0123456789abcdef0123456789");
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
    absl::StrAppend(&json, i ? "," : "", R"({"name": "k)", i, R"(", "sha256": ")",
                    absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest))),
                    R"(", "scopes": ["infer", "read"], "limits": {"requests_per_second": 1e9}})");
    f.headers.push_back("Bearer " + key);
  }
  json += "]}";
  absl::StatusOr<ApiKeySet> set = ParseApiKeys(json, "bench");
  if (!set.ok()) std::abort();
  for (const ApiKey& k : set->keys) f.who.push_back(k.bucket());
  f.keys = std::make_unique<ApiKeys>("/nonexistent", *std::move(set), absl::ZeroDuration(), nullptr);
  return f;
}

void Authorize(benchmark::State& state) {
  Fixture f = Make(static_cast<int>(state.range(0)));
  size_t i = 0;
  for (auto _ : state) {
    auto key = f.keys->Authorize(f.headers[i++ % f.headers.size()], Scope::kInfer);
    benchmark::DoNotOptimize(key);
  }
}

void Unknown(benchmark::State& state) {
  Fixture f = Make(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    auto key = f.keys->Authorize("Bearer not-a-key-of-this-server-0123456789", Scope::kInfer);
    benchmark::DoNotOptimize(key);
  }
}

void TakeRequest(benchmark::State& state) {
  Fixture f = Make(static_cast<int>(state.range(0)));
  RateLimiter limiter;
  absl::Time now = absl::Now();
  size_t i = 0;
  for (auto _ : state) {
    now += absl::Microseconds(1);
    benchmark::DoNotOptimize(limiter.TakeRequest(f.who[i++ % f.who.size()], now));
  }
}

void Both(benchmark::State& state) {
  Fixture f = Make(static_cast<int>(state.range(0)));
  RateLimiter limiter;
  absl::Time now = absl::Now();
  size_t i = 0;
  for (auto _ : state) {
    now += absl::Microseconds(1);
    auto key = f.keys->Authorize(f.headers[i++ % f.headers.size()], Scope::kInfer);
    benchmark::DoNotOptimize(limiter.TakeRequest((*key)->bucket(), now));
  }
}

BENCHMARK(Authorize)->Arg(1)->Arg(100)->Arg(1000);
BENCHMARK(Unknown)->Arg(1)->Arg(1000);
BENCHMARK(TakeRequest)->Arg(1)->Arg(1000);
BENCHMARK(Both)->Arg(1)->Arg(1000);

}  // namespace
}  // namespace qvi

BENCHMARK_MAIN();

// Per-key rate limits (docs/security.md, "Rate limits"): token buckets for requests, texts and tokens
// per second. A key's own "limits" in the key file give it buckets of its own; the file's
// "default_limits" is one set of buckets shared by every key without its own.
//
// Requests and texts are taken before the work: a call whose bucket is short is refused at once, with
// the time after which the same call would pass (RESOURCE_EXHAUSTED; the front ends send it as gRPC's
// grpc-retry-pushback-ms and HTTP's Retry-After). Tokens are known only once the texts are tokenised,
// so they are charged after the answer and may take the bucket below zero: the key's next calls wait
// until it has refilled. Each bucket holds `burst_seconds` of its rate.
#ifndef QVI_SERVER_AUTH_RATE_LIMIT_H_
#define QVI_SERVER_AUTH_RATE_LIMIT_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/core/base/sync.h"

namespace qvi {

struct RateLimits {
  // 0: no limit of that kind.
  double requests_per_second = 0;
  double texts_per_second = 0;
  double tokens_per_second = 0;
  double burst_seconds = 1;  // each bucket holds this many seconds of its rate (at least one request)
  bool any() const { return requests_per_second > 0 || texts_per_second > 0 || tokens_per_second > 0; }
  bool operator==(const RateLimits& o) const {
    return requests_per_second == o.requests_per_second && texts_per_second == o.texts_per_second &&
           tokens_per_second == o.tokens_per_second && burst_seconds == o.burst_seconds;
  }
};

// A token bucket on a clock given to each call (the server's Env, or a test's fake time).
class TokenBucket {
 public:
  TokenBucket(double rate, double capacity, absl::Time now)
      : rate_(rate), capacity_(capacity), level_(capacity), at_(now) {}

  // Takes `n` when the bucket holds it and returns zero; else takes nothing and returns how long until
  // it would. InfiniteDuration when `n` is over the capacity: no wait makes it pass.
  absl::Duration Take(double n, absl::Time now);
  // Takes `n` whatever the level (tokens known after the work): the level may go below zero.
  void Charge(double n, absl::Time now);
  // Zero when the level is not below zero, else how long until it is.
  absl::Duration Debt(absl::Time now);

  double capacity() const { return capacity_; }

 private:
  void Refill(absl::Time now);
  const double rate_, capacity_;
  double level_;
  absl::Time at_;
};

// The payload of a RESOURCE_EXHAUSTED status that says when to retry (milliseconds, as text).
inline constexpr absl::string_view kRetryAfterPayload = "type.qvi.serving/retry-after-ms";
// The retry delay a status carries, if any.
std::optional<absl::Duration> RetryAfter(const absl::Status& status);

// The buckets of every key, by its name, and the shared ones ("") of the keys without limits of their
// own. A bucket set is made at its first use and made again when its limits change (a reload of the key
// file). Thread-safe.
class RateLimiter {
 public:
  // `on_limited(key, limit)`: each refusal, with the key's name and "requests", "texts" or "tokens".
  using OnLimited = std::function<void(const std::string& key, absl::string_view limit)>;
  explicit RateLimiter(OnLimited on_limited = nullptr) : on_limited_(std::move(on_limited)) {}

  // Whose buckets a call takes from: `bucket` is the key's name, or "" for the shared ones; `key` names
  // the key in messages.
  struct Who {
    std::string bucket;
    std::string key;
    RateLimits limits;
  };

  // One request, before the request is decoded: OK, or RESOURCE_EXHAUSTED naming the key, the limit
  // and when to retry (RetryAfter). Also refused while the bucket's tokens are in debt.
  absl::Status TakeRequest(const Who& who, absl::Time now);
  // `texts` texts, once the request is decoded and before any is tokenised.
  absl::Status TakeTexts(const Who& who, int64_t texts, absl::Time now);
  // `tokens` tokens, after the answer.
  void ChargeTokens(const Who& who, int64_t tokens, absl::Time now);

 private:
  struct Buckets {
    RateLimits limits;
    std::unique_ptr<TokenBucket> requests, texts, tokens;
  };
  // Null when no limit applies.
  Buckets* For(const Who& who, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status Refuse(const Who& who, absl::string_view limit, double rate, absl::Duration wait) const;

  const OnLimited on_limited_;
  Mutex mu_;
  std::map<std::string, Buckets> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qvi

#endif  // QVI_SERVER_AUTH_RATE_LIMIT_H_

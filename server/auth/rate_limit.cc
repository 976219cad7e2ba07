#include "server/auth/rate_limit.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace qvi {
namespace {

// `key` is the caller's key; `shared` when it takes from the buckets of the keys without their own.
absl::Status Limited(const std::string& key, bool shared, absl::string_view what, double rate, absl::Duration wait) {
  const std::string whose =
      shared ? absl::StrCat("the keys without limits of their own (this one: '", key, "') share a limit of")
             : absl::StrCat("the API key '", key, "' has a limit of");
  if (wait == absl::InfiniteDuration()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s %g %s a second, with a burst smaller than this request; send fewer texts per request", whose, rate, what));
  }
  absl::Status status = absl::ResourceExhaustedError(absl::StrFormat(
      "%s %g %s a second, used up for now; retry in %.3f s", whose, rate, what, absl::ToDoubleSeconds(wait)));
  const int64_t ms = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(absl::ToDoubleMilliseconds(wait))));
  status.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(ms)));
  return status;
}

std::unique_ptr<TokenBucket> Bucket(double rate, double burst_seconds, double at_least, absl::Time now) {
  if (rate <= 0) return nullptr;
  return std::make_unique<TokenBucket>(rate, std::max(at_least, rate * burst_seconds), now);
}

}  // namespace

void TokenBucket::Refill(absl::Time now) {
  if (now > at_) {
    level_ = std::min(capacity_, level_ + rate_ * absl::ToDoubleSeconds(now - at_));
    at_ = now;
  }
}

absl::Duration TokenBucket::Take(double n, absl::Time now) {
  Refill(now);
  if (n > capacity_) return absl::InfiniteDuration();
  if (level_ >= n) {
    level_ -= n;
    return absl::ZeroDuration();
  }
  return absl::Seconds((n - level_) / rate_);
}

void TokenBucket::Charge(double n, absl::Time now) {
  Refill(now);
  level_ -= n;
}

absl::Duration TokenBucket::Debt(absl::Time now) {
  Refill(now);
  return level_ >= 0 ? absl::ZeroDuration() : absl::Seconds(-level_ / rate_);
}

std::optional<absl::Duration> RetryAfter(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryAfterPayload);  // absl::optional<absl::Cord>
  int64_t ms = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &ms)) return std::nullopt;
  return absl::Milliseconds(ms);
}

absl::Status RateLimiter::Refuse(const Who& who, absl::string_view limit, double rate, absl::Duration wait) const {
  if (on_limited_) on_limited_(who.key, limit);
  return Limited(who.key, who.bucket.empty(), limit, rate, wait);
}

RateLimiter::Buckets* RateLimiter::For(const Who& who, absl::Time now) {
  const RateLimits& limits = who.limits;
  if (!limits.any()) return nullptr;
  Buckets& b = buckets_[who.bucket];
  if ((!b.requests && !b.texts && !b.tokens) || !(b.limits == limits)) {
    b.limits = limits;
    b.requests = Bucket(limits.requests_per_second, limits.burst_seconds, 1, now);
    b.texts = Bucket(limits.texts_per_second, limits.burst_seconds, 1, now);
    b.tokens = Bucket(limits.tokens_per_second, limits.burst_seconds, 1, now);
  }
  return &b;
}

absl::Status RateLimiter::TakeRequest(const Who& who, absl::Time now) {
  MutexLock lock(&mu_);
  Buckets* b = For(who, now);
  if (b == nullptr) return absl::OkStatus();
  if (b->tokens) {
    if (absl::Duration debt = b->tokens->Debt(now); debt > absl::ZeroDuration()) {
      return Refuse(who, "tokens", b->limits.tokens_per_second, debt);
    }
  }
  if (b->requests) {
    if (absl::Duration wait = b->requests->Take(1, now); wait > absl::ZeroDuration()) {
      return Refuse(who, "requests", b->limits.requests_per_second, wait);
    }
  }
  return absl::OkStatus();
}

absl::Status RateLimiter::TakeTexts(const Who& who, int64_t texts, absl::Time now) {
  if (texts <= 0) return absl::OkStatus();
  MutexLock lock(&mu_);
  Buckets* b = For(who, now);
  if (b == nullptr || !b->texts) return absl::OkStatus();
  if (absl::Duration wait = b->texts->Take(static_cast<double>(texts), now); wait > absl::ZeroDuration()) {
    return Refuse(who, "texts", b->limits.texts_per_second, wait);
  }
  return absl::OkStatus();
}

void RateLimiter::ChargeTokens(const Who& who, int64_t tokens, absl::Time now) {
  if (tokens <= 0) return;
  MutexLock lock(&mu_);
  Buckets* b = For(who, now);
  if (b != nullptr && b->tokens) b->tokens->Charge(static_cast<double>(tokens), now);
}

}  // namespace qvi

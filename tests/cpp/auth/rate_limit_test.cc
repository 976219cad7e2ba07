#include "server/auth/rate_limit.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/auth/api_keys.h"

namespace qvi {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);

TEST(TokenBucketTest, ItRefillsAtItsRateUpToItsCapacity) {
  TokenBucket b(/*rate=*/10, /*capacity=*/5, kStart);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b.Take(1, kStart), absl::ZeroDuration()) << i;
  EXPECT_EQ(b.Take(1, kStart), absl::Milliseconds(100)) << "empty: one more in a tenth of a second";
  EXPECT_EQ(b.Take(1, kStart + absl::Milliseconds(100)), absl::ZeroDuration());
  EXPECT_EQ(b.Take(3, kStart + absl::Seconds(100)), absl::ZeroDuration()) << "refilled, to its capacity";
  EXPECT_EQ(b.Take(3, kStart + absl::Seconds(100)), absl::Milliseconds(100)) << "2 left: not 3";
  EXPECT_EQ(b.Take(6, kStart + absl::Seconds(200)), absl::InfiniteDuration()) << "more than it ever holds";
}

TEST(TokenBucketTest, ChargedTokensPutItInDebtUntilItRefills) {
  TokenBucket b(/*rate=*/100, /*capacity=*/100, kStart);
  b.Charge(300, kStart);
  EXPECT_EQ(b.Debt(kStart), absl::Seconds(2));
  EXPECT_EQ(b.Debt(kStart + absl::Seconds(1)), absl::Seconds(1));
  EXPECT_EQ(b.Debt(kStart + absl::Seconds(2)), absl::ZeroDuration());
}

RateLimiter::Who Own(const std::string& key, RateLimits limits) { return {key, key, limits}; }

TEST(RateLimiterTest, AKeyOverItsRequestsIsRefusedWithWhenToRetry) {
  std::vector<std::pair<std::string, std::string>> limited;
  RateLimiter limiter([&](const std::string& key, absl::string_view limit) { limited.emplace_back(key, limit); });
  RateLimits limits;
  limits.requests_per_second = 2;
  limits.burst_seconds = 1;
  const auto who = Own("app", limits);
  EXPECT_TRUE(limiter.TakeRequest(who, kStart).ok());
  EXPECT_TRUE(limiter.TakeRequest(who, kStart).ok());
  absl::Status refused = limiter.TakeRequest(who, kStart);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(),
            "the API key 'app' has a limit of 2 requests a second, used up for now; retry in 0.500 s");
  ASSERT_TRUE(RetryAfter(refused).has_value());
  EXPECT_EQ(*RetryAfter(refused), absl::Milliseconds(500));
  EXPECT_TRUE(limiter.TakeRequest(who, kStart + absl::Milliseconds(500)).ok());
  EXPECT_EQ(limited, (std::vector<std::pair<std::string, std::string>>{{"app", "requests"}}));
  EXPECT_FALSE(RetryAfter(absl::ResourceExhaustedError("other")).has_value());
}

TEST(RateLimiterTest, TextsAndTokensHaveBucketsOfTheirOwn) {
  RateLimiter limiter;
  RateLimits limits;
  limits.texts_per_second = 100;
  limits.tokens_per_second = 1000;
  const auto who = Own("bulk", limits);
  EXPECT_TRUE(limiter.TakeTexts(who, 60, kStart).ok());
  absl::Status texts = limiter.TakeTexts(who, 60, kStart);
  EXPECT_EQ(texts.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*RetryAfter(texts), absl::Milliseconds(200));
  absl::Status too_big = limiter.TakeTexts(who, 101, kStart + absl::Seconds(10));
  EXPECT_EQ(too_big.message(),
            "the API key 'bulk' has a limit of 100 texts a second, with a burst smaller than this request; send fewer "
            "texts per request");
  EXPECT_FALSE(RetryAfter(too_big).has_value()) << "no wait makes it pass";

  // Tokens are charged after the answer; the next request waits for the debt.
  EXPECT_TRUE(limiter.TakeRequest(who, kStart + absl::Seconds(20)).ok());
  limiter.ChargeTokens(who, 3000, kStart + absl::Seconds(20));
  absl::Status debt = limiter.TakeRequest(who, kStart + absl::Seconds(20));
  EXPECT_EQ(debt.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*RetryAfter(debt), absl::Seconds(2));
  EXPECT_TRUE(limiter.TakeRequest(who, kStart + absl::Seconds(22)).ok());
}

TEST(RateLimiterTest, KeysWithoutLimitsOfTheirOwnShareOneSetOfBuckets) {
  RateLimiter limiter;
  RateLimits shared;
  shared.requests_per_second = 1;
  const RateLimiter::Who a{"", "a", shared}, b{"", "b", shared};
  RateLimits own;
  own.requests_per_second = 1;
  EXPECT_TRUE(limiter.TakeRequest(a, kStart).ok());
  absl::Status refused = limiter.TakeRequest(b, kStart);
  EXPECT_EQ(refused.message(),
            "the keys without limits of their own (this one: 'b') share a limit of 1 requests a second, used up for "
            "now; retry in 1.000 s");
  EXPECT_TRUE(limiter.TakeRequest(Own("c", own), kStart).ok()) << "a key with its own limits is apart";
  EXPECT_TRUE(limiter.TakeRequest({"", "d", RateLimits{}}, kStart).ok()) << "no limit: never refused";
}

TEST(RateLimiterTest, NewLimitsFromAReloadStartWithAFullBucket) {
  RateLimiter limiter;
  RateLimits one;
  one.requests_per_second = 1;
  EXPECT_TRUE(limiter.TakeRequest(Own("app", one), kStart).ok());
  EXPECT_FALSE(limiter.TakeRequest(Own("app", one), kStart).ok());
  RateLimits ten = one;
  ten.requests_per_second = 10;
  EXPECT_TRUE(limiter.TakeRequest(Own("app", ten), kStart).ok());
}

TEST(RateLimitsInTheKeyFileTest, AKeysOwnLimitsOrTheDefaultsApply) {
  const std::string hash(64, 'a');
  const std::string other(64, 'b');
  absl::StatusOr<ApiKeySet> set = ParseApiKeys(
      absl::StrCat(R"({"default_limits": {"requests_per_second": 5},
                      "keys": [{"name": "a", "sha256": ")",
                   hash, R"(", "scopes": ["infer"], "limits": {"texts_per_second": 100, "burst_seconds": 2}},
                               {"name": "b", "sha256": ")",
                   other, R"(", "scopes": ["infer"]}]})"),
      "k");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE(set->keys[0].own_limits);
  EXPECT_EQ(set->keys[0].limits.texts_per_second, 100);
  EXPECT_EQ(set->keys[0].limits.requests_per_second, 0) << "its own limits replace the defaults whole";
  EXPECT_EQ(set->keys[0].limits.burst_seconds, 2);
  EXPECT_EQ(set->keys[0].bucket().bucket, "a");
  EXPECT_FALSE(set->keys[1].own_limits);
  EXPECT_EQ(set->keys[1].limits.requests_per_second, 5);
  EXPECT_EQ(set->keys[1].bucket().bucket, "") << "the shared buckets";
  EXPECT_EQ(set->keys[1].bucket().key, "b");

  const auto error = [&](const std::string& limits) {
    absl::StatusOr<ApiKeySet> bad = ParseApiKeys(absl::StrCat(R"({"keys": [{"name": "a", "sha256": ")", hash,
                                                              R"(", "scopes": ["infer"], "limits": )", limits, "}]}"),
                                                 "k");
    return bad.ok() ? std::string("accepted") : std::string(bad.status().message());
  };
  EXPECT_EQ(error(R"({"texts_per_second": 0})"),
            "k: keys[0] (a).limits.texts_per_second must be a number over 0 and at most 1e+09, got 0");
  EXPECT_EQ(error(R"({"text_per_second": 5})"),
            R"(k: keys[0] (a).limits has the field "text_per_second", which is none of "requests_per_second", )"
            R"("texts_per_second", "tokens_per_second", "burst_seconds")");
  EXPECT_EQ(error(R"({"burst_seconds": 2})"),
            "k: keys[0] (a).limits sets only burst_seconds: give requests_per_second, texts_per_second or "
            "tokens_per_second");
  EXPECT_EQ(error("[]"),
            R"(k: keys[0] (a).limits must be an object with some of "requests_per_second", "texts_per_second", )"
            R"("tokens_per_second", "burst_seconds")");
}

}  // namespace
}  // namespace qvi

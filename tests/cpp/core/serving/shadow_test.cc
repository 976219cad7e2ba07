// Shadow versions (server/core/serving/shadow.h, shadow_compare.h): the per-text comparison's arithmetic, and
// the mirror — which texts it samples, what it asks of the two versions, what it sheds and counts, and the
// summary it keeps — against a real repository (the demo sentiment model as versions 1 and 2, version 2 the
// candidate) and a dispatch the test answers by hand.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/core/serving/shadow.h"
#include "server/core/serving/shadow_compare.h"
#include "tests/cpp/test_util/run.h"
#include "tests/cpp/test_util/store.h"

namespace qvi {
namespace {

TEST(SpearmanCorrelationTest, RanksWithTiesAndRefusesWhatHasNone) {
  EXPECT_DOUBLE_EQ(*SpearmanCorrelation({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(*SpearmanCorrelation({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  // Ties take their mean rank: ranks (1.5, 1.5, 3) and (1, 2, 3): ρ = 1.5 / sqrt(1.5 · 2).
  EXPECT_NEAR(*SpearmanCorrelation({5, 5, 9}, {1, 2, 3}), 1.5 / std::sqrt(3.0), 1e-12);
  EXPECT_FALSE(SpearmanCorrelation({1, 1, 1}, {1, 2, 3}));  // a constant series
  EXPECT_FALSE(SpearmanCorrelation({1}, {1}));
  EXPECT_FALSE(SpearmanCorrelation({1, 2}, {1, 2, 3}));
  EXPECT_FALSE(SpearmanCorrelation({1, std::nan(""), 3}, {1, 2, 3}));  // no sort over a NaN
}

TokenOutput Word(float attention, std::vector<float> contribution = {}) {
  TokenOutput t;
  t.attention = attention;
  t.contribution = std::move(contribution);
  return t;
}

TEST(CompareTextsTest, ComparesLabelsScoresAndTheExplanationOfTheServingVersionsLabel) {
  TextResult live, shadow;
  live.labels = {{"positive", 0.9f}, {"negative", 0.1f}};
  shadow.labels = {{"negative", 0.6f}, {"positive", 0.4f}};
  // Contributions to "positive": the live answer's first column, the shadow's second (its labels' order).
  live.tokens = {Word(0.1f, {0.5f, -0.5f}), Word(0.2f, {0.1f, -0.1f}), Word(0.7f, {0.9f, -0.9f})};
  shadow.tokens = {Word(0.3f, {-0.2f, 0.4f}), Word(0.3f, {-0.1f, 0.2f}), Word(0.4f, {-0.3f, 0.8f})};
  const TextComparison c = CompareTexts(live, shadow);
  EXPECT_EQ(c.live_label, "positive");
  EXPECT_EQ(c.shadow_label, "negative");
  EXPECT_FALSE(c.agrees());
  EXPECT_NEAR(*c.score_difference, 0.4 - 0.9, 1e-6);
  EXPECT_STREQ(c.explained_by, "contributions");
  EXPECT_DOUBLE_EQ(*c.rank_correlation, 1.0);  // 0.5, 0.1, 0.9 against 0.4, 0.2, 0.8
  // Without contributions on one side, α: 0.1, 0.2, 0.7 against 0.3, 0.3, 0.4 (ties).
  for (TokenOutput& t : shadow.tokens) t.contribution.clear();
  const TextComparison by_alpha = CompareTexts(live, shadow);
  EXPECT_STREQ(by_alpha.explained_by, "attention");
  EXPECT_NEAR(*by_alpha.rank_correlation, *SpearmanCorrelation({0.1, 0.2, 0.7}, {0.3, 0.3, 0.4}), 1e-6);
}

SpanOutput Span(const std::string& label, uint32_t start, uint32_t end) {
  SpanOutput s;
  s.label = label;
  s.start = start;
  s.end = end;
  return s;
}

TEST(CompareTextsTest, CountsTheSpansBothFindAlike) {
  TextResult live, shadow;
  live.spans = {Span("PER", 0, 5), Span("LOC", 10, 16)};
  shadow.spans = {Span("PER", 0, 5), Span("ORG", 10, 16), Span("MISC", 20, 22)};
  const TextComparison c = CompareTexts(live, shadow);
  EXPECT_EQ(c.live_spans, 2);
  EXPECT_EQ(c.shadow_spans, 3);
  EXPECT_EQ(c.same_spans, 1);
  EXPECT_FALSE(c.agrees());
  EXPECT_FALSE(c.score_difference);  // a tagger's texts have no label
  shadow.spans.resize(1);
  live.spans.resize(1);
  EXPECT_TRUE(CompareTexts(live, shadow).agrees());
  // A span found twice by one side matches the other's once: F1 stays within 1.
  live.spans.push_back(live.spans[0]);
  EXPECT_EQ(CompareTexts(live, shadow).same_spans, 1);
}

// A repository with the demo sentiment model as versions 1 and 2, version 2 the shadow candidate.
class ShadowMirrorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    store_ = new testing::TempStore("shadow_test");
    store_->CopyDemoFile("sentiment/1/model.pt", "sentiment/1/model.pt");
    store_->CopyDemoFile("sentiment/1/model.pt", "sentiment/2/model.pt");
    store_->Write("sentiment/serving.json",
                  R"({"version_policy": "specific:1,2", "shadow": {"version": 2, "fraction": 1.0}})");
    auto repo = testing::PolledCpuRepository(store_->str());
    ASSERT_TRUE(repo.ok()) << repo.status();
    repo_ = repo->release();
  }
  static void TearDownTestSuite() {
    delete repo_;
    delete store_;
  }

  // The serving version's answer to `texts` (only what the mirror reads of it).
  static InferenceResponse LiveAnswer() {
    InferenceResponse r;
    r.model = "sentiment";
    r.version = 1;
    r.request_id = "req-7";
    r.manifest = (*repo_->Resolve("sentiment", 1))->model->shared_manifest();
    return r;
  }
  // An answer of `version` to `request`: each text labelled as `label(i)`.
  static InferenceResponse Answer(const InferenceRequest& request, const std::vector<std::string>& labels,
                                  absl::Duration compute) {
    InferenceResponse r;
    r.model = request.model;
    r.version = request.version;
    r.compute_time = compute;
    for (size_t i = 0; i < request.texts.size(); ++i) {
      TextResult t;
      const std::string& top = labels[i % labels.size()];
      t.labels = {{top, 0.75f}, {top == "positive" ? "negative" : "positive", 0.25f}};
      r.results.push_back(std::move(t));
    }
    return r;
  }

  struct Sent {
    Method method;
    InferenceRequest request;
    ShadowMirror::Done done;
  };
  ShadowMirror::Dispatch Keep(std::vector<Sent>* sent, bool accept = true) {
    return [sent, accept](Method m, InferenceRequest r, ShadowMirror::Done d) {
      if (!accept) return false;
      sent->push_back(Sent{m, std::move(r), std::move(d)});
      return true;
    };
  }

  static testing::TempStore* store_;
  static ModelRepository* repo_;
};

testing::TempStore* ShadowMirrorTest::store_ = nullptr;
ModelRepository* ShadowMirrorTest::repo_ = nullptr;

TEST_F(ShadowMirrorTest, TheCandidateAnswersOnlyRequestsThatNameIt) {
  absl::StatusOr<ServableHandle> newest = repo_->Resolve("sentiment", 0);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ((*newest)->version, 1) << "a request that names no version reached the shadow candidate";
  EXPECT_EQ((*repo_->Resolve("sentiment", 2))->version, 2);
  ShadowMirror mirror(repo_, nullptr, {});
  ASSERT_TRUE(mirror.Wants("sentiment", 0));
  EXPECT_EQ(mirror.Wants("sentiment", 0)->version, 2);
  EXPECT_FALSE(mirror.Wants("sentiment", 1)) << "a request for a version is not mirrored";
}

TEST_F(ShadowMirrorTest, MirrorsBothVersionsAlikeAtTheLowestPriorityAndSumsTheComparison) {
  ShadowMirror::Options options;
  options.keep_disagreements = 2;
  ShadowMirror mirror(repo_, nullptr, options);
  std::vector<Sent> sent;
  const std::vector<std::string> texts = {"a fine film", "a dull film", "fine", "dull"};
  ShadowSettings settings = *mirror.Wants("sentiment", 0);
  settings.keep_texts = true;
  mirror.Mirror(Method::kClassify, settings, texts, LiveAnswer(), absl::Now(), Keep(&sent));
  ASSERT_EQ(sent.size(), 2u);
  for (const Sent& s : sent) {
    EXPECT_EQ(s.request.texts, texts);  // fraction 1: every text
    EXPECT_EQ(s.request.priority, Priority::kLow);
    EXPECT_EQ(s.request.request_id, "shadow-req-7");
    EXPECT_TRUE(s.request.options.Asks(OutputSwitch::kTokens));
    EXPECT_TRUE(s.request.options.Asks(OutputSwitch::kContributions));
    EXPECT_GT(s.request.options.top_k, 1);
    EXPECT_NE(s.request.deadline, absl::InfiniteFuture());
  }
  EXPECT_EQ(sent[0].request.version, 1);
  EXPECT_EQ(sent[1].request.version, 2);
  // The serving version says positive, negative, positive, negative; the candidate positive throughout.
  sent[1].done(Answer(sent[1].request, {"positive"}, absl::Milliseconds(7)));
  EXPECT_EQ(mirror.Summaries("sentiment")[0].compared, 0) << "compared before both answered";
  sent[0].done(Answer(sent[0].request, {"positive", "negative"}, absl::Milliseconds(5)));
  const std::vector<ShadowSummary> all = mirror.Summaries("sentiment");
  ASSERT_EQ(all.size(), 1u);
  const ShadowSummary& s = all[0];
  EXPECT_EQ(s.live_version, 1);
  EXPECT_EQ(s.shadow_version, 2);
  EXPECT_EQ(s.mirrored, 4);
  EXPECT_EQ(s.compared, 4);
  EXPECT_DOUBLE_EQ(s.label_agreement(), 0.5);
  ASSERT_EQ(s.flips.size(), 1u);
  EXPECT_EQ((s.flips.at({"negative", "positive"})), 2);
  // The candidate gives the serving version's label 0.75 where they agree, 0.25 where they do not.
  EXPECT_NEAR(*s.mean_score_difference(), (0 + 0 - 0.5 - 0.5) / 4.0, 1e-6);
  EXPECT_NEAR(*s.mean_latency_difference_ms(), 2.0, 1e-9);
  ASSERT_EQ(s.disagreements.size(), 2u);  // at most keep_disagreements, the flipped texts
  EXPECT_EQ(s.disagreements[0].comparison.live_label, "negative");
  EXPECT_EQ(s.disagreements[0].text, "a dull film");
  EXPECT_EQ(s.disagreements[0].text_sha256, TextSha256("a dull film"));
  mirror.Stop();  // draining: nothing more is mirrored
  std::vector<Sent> after;
  mirror.Mirror(Method::kClassify, settings, texts, LiveAnswer(), absl::Now(), Keep(&after));
  EXPECT_TRUE(after.empty());
  EXPECT_EQ(TextSha256("a dull film").size(), 64u);
}

TEST_F(ShadowMirrorTest, WhatCannotRunIsDroppedAndCounted) {
  ShadowMirror::Options options;
  options.max_inflight_texts = 3;
  ShadowMirror mirror(repo_, nullptr, options);
  const ShadowSettings settings = *mirror.Wants("sentiment", 0);
  std::vector<Sent> sent;
  // Four texts would pass three in flight: dropped whole, nothing dispatched.
  mirror.Mirror(Method::kClassify, settings, {"a", "b", "c", "d"}, LiveAnswer(), absl::Now(), Keep(&sent));
  EXPECT_TRUE(sent.empty());
  // Two fit; the batch queue sheds the candidate's (RESOURCE_EXHAUSTED).
  mirror.Mirror(Method::kClassify, settings, {"a", "b"}, LiveAnswer(), absl::Now(), Keep(&sent));
  ASSERT_EQ(sent.size(), 2u);
  // While those two are in flight, two more would pass the three.
  std::vector<Sent> more;
  mirror.Mirror(Method::kClassify, settings, {"c", "d"}, LiveAnswer(), absl::Now(), Keep(&more));
  EXPECT_TRUE(more.empty());
  sent[0].done(Answer(sent[0].request, {"positive"}, absl::ZeroDuration()));
  sent[1].done(absl::ResourceExhaustedError("shed for a higher priority"));
  // A full request queue: the second dispatch is refused, the first answered.
  std::vector<Sent> refused;
  mirror.Mirror(Method::kClassify, settings, {"e"}, LiveAnswer(), absl::Now(), Keep(&refused, false));
  const ShadowSummary s = mirror.Summaries("sentiment")[0];
  EXPECT_EQ(s.mirrored, 9);
  EXPECT_EQ(s.compared, 0);
  EXPECT_EQ(s.dropped.at("busy"), 7);  // over the limit twice, and the one whose dispatch was refused
  EXPECT_EQ(s.dropped.at("shed"), 2);
  // Everything released: three texts fit again.
  std::vector<Sent> after;
  mirror.Mirror(Method::kClassify, settings, {"x", "y", "z"}, LiveAnswer(), absl::Now(), Keep(&after));
  EXPECT_EQ(after.size(), 2u);
}

TEST_F(ShadowMirrorTest, ASampleThatFindsNoIdleCpuIsDroppedUnrun) {
  ShadowMirror::Options options;
  options.max_inflight_texts = 1;  // a text dropped as "cpu" must not hold a place in flight
  std::vector<absl::Time> asked;
  bool idle = false;
  options.idle = [&](absl::Time now) {
    asked.push_back(now);
    return idle;
  };
  ShadowMirror mirror(repo_, nullptr, options);
  const ShadowSettings settings = *mirror.Wants("sentiment", 0);
  const absl::Time now = absl::FromUnixSeconds(1000);
  std::vector<Sent> sent;
  mirror.Mirror(Method::kClassify, settings, {"a", "b", "c"}, LiveAnswer(), now, Keep(&sent));
  EXPECT_TRUE(sent.empty());
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], now);  // asked at the core's time
  idle = true;
  mirror.Mirror(Method::kClassify, settings, {"d"}, LiveAnswer(), now, Keep(&sent));
  ASSERT_EQ(sent.size(), 2u) << "the one place in flight was held by the dropped texts";
  const ShadowSummary s = mirror.Summaries("sentiment")[0];
  EXPECT_EQ(s.mirrored, 4);
  EXPECT_EQ(s.dropped.at("cpu"), 3);
  EXPECT_EQ(s.dropped.count("busy"), 0u);
  ShadowSettings none = settings;
  none.fraction = 1e-12;  // nothing sampled: the CPU is not asked
  mirror.Mirror(Method::kClassify, none, {"e"}, LiveAnswer(), now, Keep(&sent));
  EXPECT_EQ(asked.size(), 2u);
}

}  // namespace
}  // namespace qvi

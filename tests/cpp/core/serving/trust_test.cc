// How far to trust a score (trust.h): the options' ranges and the model's card decide what is refused, with
// the field named; a label set holds the labels at or above the card's threshold for the coverage asked
// for, most probable first, and may be empty; abstention marks answers below the threshold.
#include "server/core/serving/trust.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/core/request/request_checks.h"

namespace qvi {
namespace {

Manifest Calibrated() {
  Manifest m;
  m.name = "topics";
  m.task = Task::kClassification;
  m.labels = {"business", "sport", "tech"};
  CalibrationCard card;
  card.temperature = 1.2;
  card.conformal = {{0.9, 0.4, 0.9}, {0.95, 0.1, 0.95}};
  m.calibration = card;
  return m;
}

std::string Error(const absl::Status& s) { return std::string(s.message()); }

// serving.json's abstain_below fills a request that set none; a request's own threshold (0 included: none
// abstains) and raw_scores (no calibrated scores to judge) keep theirs.
TEST(TrustTest, AModelsDefaultThresholdAppliesOnlyWhereTheRequestSetNone) {
  ServingConfig serving;
  serving.abstain_below = 0.6;
  OutputOptions plain;
  ApplyServingDefaults(serving, plain);
  EXPECT_EQ(plain.abstain_below, 0.6);
  OutputOptions own;
  own.abstain_below = 0.0;
  ApplyServingDefaults(serving, own);
  EXPECT_EQ(own.abstain_below, 0.0);
  OutputOptions raw;
  raw.raw_scores = true;
  ApplyServingDefaults(serving, raw);
  EXPECT_FALSE(raw.abstain_below.has_value());
  EXPECT_TRUE(CheckTrustRanges(raw).ok());
  OutputOptions none;
  ApplyServingDefaults(ServingConfig{}, none);
  EXPECT_FALSE(none.abstain_below.has_value());
}

TEST(TrustTest, BadOptionsAreRefusedNamingTheField) {
  OutputOptions o;
  EXPECT_TRUE(CheckTrustRanges(o).ok());
  o.coverage = 1.5;
  EXPECT_EQ(Error(CheckTrustRanges(o)), "options.coverage: 1.5 is outside (0, 1)");
  o.coverage = 0;
  EXPECT_EQ(Error(CheckTrustRanges(o)), "options.coverage: 0 is outside (0, 1)");
  o.coverage.reset();
  o.abstain_below = -0.1;
  EXPECT_EQ(Error(CheckTrustRanges(o)), "options.abstain_below: -0.1 is outside [0, 1]");
  o.abstain_below = 0.5;
  o.raw_scores = true;
  EXPECT_EQ(CheckTrustRanges(o).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Error(CheckTrustRanges(o)),
            "options.abstain_below: reads calibrated probabilities; not with options.raw_scores");

  const Manifest m = Calibrated();
  OutputOptions asks;
  asks.coverage = 0.8;
  EXPECT_EQ(Error(CheckTrustOptions(Method::kClassify, asks, m)),
            "options.coverage: 0.8 is not a level model 'topics' was calibrated for (0.9, 0.95)");
  asks.coverage = 0.9;
  EXPECT_TRUE(CheckTrustOptions(Method::kClassify, asks, m).ok());
  EXPECT_EQ(Error(CheckTrustOptions(Method::kTag, asks, m)),
            "options.coverage: label sets are for Classify; model 'topics' tags");
  Manifest raw = m;
  raw.calibration.reset();
  absl::Status none = CheckTrustOptions(Method::kClassify, asks, raw);
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      Error(none),
      "options.coverage: model 'topics' has no calibration on its card (`python -m qvi calibrate --write` adds one)");
  OutputOptions abstain;
  abstain.abstain_below = 0.7;
  EXPECT_EQ(CheckTrustOptions(Method::kTag, abstain, raw).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(CheckTrustOptions(Method::kTag, abstain, m).ok());
  EXPECT_TRUE(CheckTrustOptions(Method::kClassify, OutputOptions{}, raw).ok()) << "nothing asked: nothing needed";
}

TEST(TrustTest, ALabelSetHoldsTheLabelsAtTheCardsThresholdMostProbableFirst) {
  const Manifest m = Calibrated();
  OutputOptions o;
  o.coverage = 0.95;  // min_probability 0.1
  o.abstain_below = 0.6;
  TextResult r;
  FillLabelTrust(m, o, {0.35f, 0.05f, 0.6f}, r);
  ASSERT_TRUE(r.label_set.has_value());
  EXPECT_EQ(r.label_set->labels, (std::vector<std::string>{"tech", "business"}));
  EXPECT_EQ(r.label_set->min_probability, 0.1);
  EXPECT_FALSE(r.abstained) << "0.6 is not below 0.6";
  o.abstain_below = 0.7;  // 0.7F is 0.69999999: not below 0.7 either
  TextResult edge;
  FillLabelTrust(m, o, {0.3f, 0.0f, 0.7f}, edge);
  EXPECT_FALSE(edge.abstained);
  o.abstain_below = 0.7001;
  FillLabelTrust(m, o, {0.3f, 0.0f, 0.7f}, edge);
  EXPECT_TRUE(edge.abstained);
  o.coverage = 0.9;  // min_probability 0.4: nothing passes
  TextResult empty;
  FillLabelTrust(m, o, {0.35f, 0.3f, 0.35f}, empty);
  ASSERT_TRUE(empty.label_set.has_value());
  TextResult at;  // a probability at the threshold, as a float, joins the set
  FillLabelTrust(m, o, {0.4f, 0.3f, 0.3f}, at);
  EXPECT_EQ(at.label_set->labels, (std::vector<std::string>{"business"}));
  EXPECT_TRUE(empty.label_set->labels.empty()) << "an empty set: no label is likely enough";
  EXPECT_TRUE(empty.abstained);
  TextResult unasked;
  FillLabelTrust(m, OutputOptions{}, {0.35f, 0.3f, 0.35f}, unasked);
  EXPECT_FALSE(unasked.label_set.has_value());
  EXPECT_FALSE(unasked.abstained);

  TextResult spans;
  spans.spans.resize(2);
  spans.spans[0].score = 0.9f;
  spans.spans[1].score = 0.5f;
  OutputOptions below;
  below.abstain_below = 0.8;
  FillSpanTrust(below, spans);
  EXPECT_FALSE(spans.spans[0].abstained);
  EXPECT_TRUE(spans.spans[1].abstained);
}

}  // namespace
}  // namespace qvi

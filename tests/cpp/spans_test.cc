// Span decoding from BIO / BIOES, including ill-formed sequences, and top-k.
#include "server/core/text/spans.h"

#include <gtest/gtest.h>

#include "server/core/serving/postprocess.h"

namespace qvi {
namespace {

std::string Show(const std::vector<TagSpan>& spans) {
  std::string s;
  for (const TagSpan& t : spans) s += "(" + std::to_string(t.start) + "," + std::to_string(t.end) + "," + t.type + ")";
  return s;
}

TEST(SpansTest, BioAndBioes) {
  EXPECT_EQ(Show(DecodeSpans({"B-PER", "I-PER", "O", "B-LOC"})), "(0,2,PER)(3,4,LOC)");
  EXPECT_EQ(Show(DecodeSpans({"S-PER", "B-LOC", "I-LOC", "E-LOC", "S-ORG"})), "(0,1,PER)(1,4,LOC)(4,5,ORG)");
  EXPECT_EQ(Show(DecodeSpans({"O", "O"})), "");
  EXPECT_EQ(Show(DecodeSpans({})), "");
}

TEST(SpansTest, IllFormedSequencesAreReadLikeConlleval) {
  EXPECT_EQ(Show(DecodeSpans({"I-PER", "I-PER", "O"})), "(0,2,PER)");               // I- after O starts
  EXPECT_EQ(Show(DecodeSpans({"B-PER", "I-LOC", "I-LOC"})), "(0,1,PER)(1,3,LOC)");  // type change
  EXPECT_EQ(Show(DecodeSpans({"B-PER", "B-PER"})), "(0,1,PER)(1,2,PER)");
  EXPECT_EQ(Show(DecodeSpans({"E-LOC", "E-LOC"})), "(0,1,LOC)(1,2,LOC)");
  EXPECT_EQ(Show(DecodeSpans({"O", "I-ORG"})), "(1,2,ORG)");
  EXPECT_EQ(Show(DecodeSpans({"B-geo-loc", "I-geo-loc"})), "(0,2,geo-loc)");  // types may hold '-'
}

TEST(TopKTest, SortsByProbabilityAndClampsK) {
  const torch::Tensor logits = torch::tensor({0.0f, 2.0f, 1.0f});
  const std::vector<std::string> labels = {"a", "b", "c"};
  auto best = TopK(logits, labels, 0);
  ASSERT_EQ(best.size(), 1u);
  EXPECT_EQ(best[0].first, "b");
  auto all = TopK(logits, labels, 10);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1].first, "c");
  EXPECT_EQ(all[2].first, "a");
  float sum = 0;
  for (auto& [_, p] : all) sum += p;
  EXPECT_NEAR(sum, 1.0f, 1e-6);
  EXPECT_NEAR(all[0].second, std::exp(2.0) / (1 + std::exp(1.0) + std::exp(2.0)), 1e-6);
  auto tie = TopK(torch::tensor({1.0f, 1.0f}), {"x", "y"}, 2);
  EXPECT_EQ(tie[0].first, "x");  // ties keep the label order
}

}  // namespace
}  // namespace qvi

// Span decoding from BIO / BIOES, including ill-formed sequences (no torch: text_manifest_test).
#include "server/core/text/spans.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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

}  // namespace
}  // namespace qvi

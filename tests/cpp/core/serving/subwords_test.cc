// A sub-word model's outputs grouped into words (subwords.h's rules), occlusion's word variants, and
// spans carried over to the sub-word view.
#include "server/core/serving/subwords.h"

#include <gtest/gtest.h>

#include <torch/types.h>

#include <stdexcept>
#include <vector>

namespace qvi {
namespace {

// [CLS] un ##believ ##able film [SEP] [pad]: words "unbelievable" (positions 1-3) and "film" (4); one
// padding position past the text, as a batch's longer neighbour leaves.
std::vector<WordPieces> Words() {
  WordPieces a, b;
  a.first = 1;
  a.end = 4;
  b.first = 4;
  b.end = 5;
  return {a, b};
}

TEST(FoldToWordsTest, SumsWhatAddsUpAveragesGatesAndTakesTheFirstSubwordsTag) {
  ModelOutputs out;
  // Batch row 1 is the text; row 0 another one that must not leak in.
  out[Output::kAttention] = torch::tensor({{9.f, 9.f, 9.f, 9.f, 9.f, 9.f, 9.f}, {.1f, .2f, .3f, .1f, .2f, .1f, 0.f}});
  out[Output::kGates] = torch::tensor({{9.f, 9.f, 9.f, 9.f, 9.f, 9.f, 9.f}, {0.f, .2f, .4f, .9f, .5f, 0.f, 0.f}});
  out[Output::kTags] = torch::tensor({{9, 9, 9, 9, 9, 9, 9}, {0, 3, 4, 4, 1, 0, -1}}, torch::kLong);
  out[Output::kEmissions] = torch::arange(2 * 7 * 2, torch::kFloat).view({2, 7, 2});
  out[Output::kContribution] = torch::ones({2, 7, 3});
  out[Output::kLogits] = torch::tensor({{1.f, 2.f}, {3.f, 4.f}});
  const ModelOutputs words = FoldToWords(out, 1, Words(), OutputSet().set());
  const at::Tensor a = words.at(Output::kAttention);
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{1, 2}));
  EXPECT_NEAR(a[0][0].item<float>(), .2f + .3f + .1f, 1e-6);
  EXPECT_NEAR(a[0][1].item<float>(), .2f, 1e-6);
  const at::Tensor g = words.at(Output::kGates);
  EXPECT_NEAR(g[0][0].item<float>(), (.2f + .4f + .9f) / 3, 1e-6);
  EXPECT_NEAR(g[0][1].item<float>(), .5f, 1e-6);
  const at::Tensor tags = words.at(Output::kTags);
  EXPECT_EQ(tags[0][0].item<int64_t>(), 3) << "the first sub-word's tag";
  EXPECT_EQ(tags[0][1].item<int64_t>(), 1);
  EXPECT_TRUE(words.at(Output::kEmissions)[0][0].equal(out.at(Output::kEmissions)[1][1]));
  const at::Tensor c = words.at(Output::kContribution);
  ASSERT_EQ(c.sizes(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_FLOAT_EQ(c[0][0][2].item<float>(), 3.f);
  EXPECT_FLOAT_EQ(c[0][1][0].item<float>(), 1.f);
  EXPECT_TRUE(words.at(Output::kLogits).equal(torch::tensor({{3.f, 4.f}})));
}

TEST(FoldToWordsTest, MapsAverageTheRowsAndSumTheColumnsOfAWord) {
  ModelOutputs out;
  // One layer, one head: a uniform map over the text's 6 positions ([B,L,H,T,T], T = 7 with padding).
  at::Tensor map = torch::zeros({1, 1, 1, 7, 7});
  map.slice(3, 0, 6).slice(4, 0, 6).fill_(1.f / 6);
  map[0][0][0][2][1] = 0.5f;  // "##believ" attends more to "un"
  map[0][0][0][2][2] = 0.f;
  map[0][0][0][2][3] = 0.f;
  map[0][0][0][2][4] = 0.f;
  out[Output::kLayerAttention] = map;
  out[Output::kLayerGates] = torch::tensor({0.f, .3f, .6f, .9f, .2f, 0.f, 0.f}).view({1, 1, 1, 7});
  const ModelOutputs words = FoldToWords(out, 0, Words(), OutputSet().set());
  // Only what the request wants is folded: a batch carries every output any of its requests asked for.
  EXPECT_FALSE(FoldToWords(out, 0, Words(), OutputsOf({Output::kLayerGates})).has(Output::kLayerAttention));
  const at::Tensor m = words.at(Output::kLayerAttention);
  ASSERT_EQ(m.sizes(), (std::vector<int64_t>{1, 1, 1, 2, 2}));
  // From "unbelievable": the mean of three rows; to it: the sum of three columns.
  const float row1 = 3.f / 6, row2 = 0.5f, row3 = 3.f / 6;
  EXPECT_NEAR(m[0][0][0][0][0].item<float>(), (row1 + row2 + row3) / 3, 1e-6);
  EXPECT_NEAR(m[0][0][0][0][1].item<float>(), (1.f / 6 + 0.f + 1.f / 6) / 3, 1e-6);
  EXPECT_NEAR(m[0][0][0][1][0].item<float>(), 3.f / 6, 1e-6);
  EXPECT_NEAR(words.at(Output::kLayerGates)[0][0][0][0].item<float>(), .6f, 1e-6);
}

TEST(FoldToWordsTest, RefusesWordsOutsideTheOutputs) {
  ModelOutputs out;
  out[Output::kAttention] = torch::zeros({1, 4});
  EXPECT_THROW(FoldToWords(out, 0, Words(), OutputSet().set()), std::invalid_argument);
  EXPECT_THROW(FoldToWords(out, 1, Words(), OutputSet().set()), std::out_of_range);
}

TEST(WordOcclusionTest, DeletesEachWordWhole) {
  const std::vector<int64_t> ids = {101, 7, 8, 9, 20, 102};
  const std::vector<std::vector<int64_t>> variants = WordOcclusionVariantIds(ids, Words());
  ASSERT_EQ(variants.size(), 2u);
  EXPECT_EQ(variants[0], (std::vector<int64_t>{101, 20, 102}));
  EXPECT_EQ(variants[1], (std::vector<int64_t>{101, 7, 8, 9, 102}));
  EXPECT_EQ(WordOcclusionVariantTokens(6, Words()), 3 + 5);
  EXPECT_TRUE(WordOcclusionVariantIds(ids, {Words()[0]}).empty()) << "one word: nothing would be left to read";
}

TEST(SpansOnSubwordsTest, CountsTheSubwordsOfTheSpansWords) {
  std::vector<SpanOutput> spans(1);
  spans[0].token_start = 0;
  spans[0].token_end = 2;
  SpansOnSubwords(Words(), spans);
  EXPECT_EQ(spans[0].token_start, 1u);
  EXPECT_EQ(spans[0].token_end, 5u);
  spans[0].token_end = 7;
  EXPECT_THROW(SpansOnSubwords(Words(), spans), std::out_of_range);
}

}  // namespace
}  // namespace qvi

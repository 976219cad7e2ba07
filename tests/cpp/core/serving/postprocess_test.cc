// A text's answer from its row of the batch's outputs: top-k labels, the softmax over a row's memory,
// and a tagger's row decoded into tags and spans.
#include "server/core/serving/postprocess.h"

#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace qvi {
namespace {

TEST(TopKTest, SortsByProbabilityAndClampsK) {
  const std::vector<float> probs = SoftmaxRow(torch::tensor({{0.0f, 2.0f, 1.0f}}), 0);
  const std::vector<std::string> labels = {"a", "b", "c"};
  auto best = TopK(probs, labels, 0);
  ASSERT_EQ(best.size(), 1u);
  EXPECT_EQ(best[0].first, "b");
  auto all = TopK(probs, labels, 10);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1].first, "c");
  EXPECT_EQ(all[2].first, "a");
  float sum = 0;
  for (auto& [_, p] : all) sum += p;
  EXPECT_NEAR(sum, 1.0f, 1e-6);
  EXPECT_NEAR(all[0].second, std::exp(2.0) / (1 + std::exp(1.0) + std::exp(2.0)), 1e-6);
  auto tie = TopK(SoftmaxRow(torch::tensor({{1.0f, 1.0f}}), 0), {"x", "y"}, 2);
  EXPECT_EQ(tie[0].first, "x");  // ties keep the label order
}

// The softmax the answers carry, computed over a row's memory, agrees with torch's own on every row of
// a batch, whatever the layout: contiguous, a transposed view (strided rows), a column slice, bf16
// (converted), and logits far apart (the maximum is subtracted, so nothing overflows).
TEST(TopKTest, SoftmaxRowMatchesTorchOnAnyLayout) {
  torch::manual_seed(7);
  const at::Tensor base = torch::randn({6, 5}) * 4;
  const std::vector<at::Tensor> layouts = {base, base.t().contiguous().t(), torch::randn({6, 9}).slice(1, 2, 7),
                                           base.to(torch::kBFloat16), base * 30};
  for (const at::Tensor& logits : layouts) {
    for (int64_t row = 0; row < logits.size(0); ++row) {
      const at::Tensor want = torch::softmax(logits[row].to(torch::kFloat), 0);
      const std::vector<float> got = SoftmaxRow(logits, row);
      ASSERT_EQ(static_cast<int64_t>(got.size()), want.size(0));
      for (size_t c = 0; c < got.size(); ++c) EXPECT_NEAR(got[c], want[c].item<float>(), 1e-6) << row << "," << c;
    }
  }
  EXPECT_THROW(SoftmaxRow(base, 6), std::out_of_range);
  EXPECT_THROW(SoftmaxRow(torch::zeros({2, 3, 4}), 0), std::invalid_argument);
}

// The tokens of "ab cd ef gh", as a tagger's answer holds them before its tags are decoded.
TextResult FourTokens() {
  TextResult r;
  for (uint32_t i = 0; i < 4; ++i) {
    TokenOutput out;
    out.token.byte_start = 3 * i;
    out.token.byte_end = 3 * i + 2;
    r.tokens.push_back(out);
  }
  return r;
}

// A tagger's row read through its strides gives the tags and span scores torch's own softmax gives,
// on a transposed (strided) batch too; a row or a token count the batch does not hold is refused.
TEST(DecodeTaggingTest, ReadsAnyLayoutAndRefusesRowsTheBatchLacks) {
  Manifest m;
  m.tags = {"O", "B-PER", "I-PER"};
  const at::Tensor tags = torch::tensor({0, 1, 2, 0, 1, 0, 0, 0}, torch::kLong).reshape({2, 4});
  torch::manual_seed(3);
  const at::Tensor emissions = torch::randn({2, 4, 3});
  const std::string text = "ab cd ef gh";
  auto result_of = [&](const at::Tensor& t, const at::Tensor& e, int64_t row) {
    TextResult r = FourTokens();
    DecodeTagging(m, t, e, row, text, r, /*crf=*/nullptr, /*temperature=*/1.0);
    return r;
  };
  const TextResult r = result_of(tags, emissions, 0);
  ASSERT_EQ(r.spans.size(), 1u);
  EXPECT_EQ(r.spans[0].text, "cd ef");
  const at::Tensor p = torch::softmax(emissions[0], 1);
  EXPECT_NEAR(r.spans[0].score, (p[1][1].item<float>() + p[2][2].item<float>()) / 2, 1e-6);
  // The same batch laid out transposed in memory.
  const TextResult strided =
      result_of(tags.t().contiguous().t(), emissions.transpose(0, 2).contiguous().transpose(0, 2), 0);
  ASSERT_EQ(strided.spans.size(), 1u);
  EXPECT_EQ(strided.spans[0].score, r.spans[0].score);
  EXPECT_EQ(result_of(tags, emissions, 1).spans[0].text, "ab");
  EXPECT_THROW(result_of(tags, emissions, 2), std::out_of_range);
  EXPECT_THROW(result_of(tags.slice(1, 0, 3), emissions, 0), std::out_of_range);  // 4 tokens, 3 tags
}

// The scores at the model card's temperature T: a classifier's softmax of logits / T (T = 1 the plain
// softmax to the bit); a CRF tagger's entity scores the mean forward-backward marginal of its tags with
// every potential divided by T, the same number options.occlusion gives the entity.
TEST(CalibratedScoresTest, AreTheSoftmaxAndTheCrfMarginalsAtTheCardsTemperature) {
  torch::manual_seed(11);
  const at::Tensor logits = torch::randn({2, 3}) * 4;
  const std::vector<float> plain = SoftmaxRow(logits, 1);
  const at::Tensor expected = torch::softmax(logits[1], 0);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(plain[j], SoftmaxRow(logits, 1, 1.0)[j]);
  const std::vector<float> warm = SoftmaxRow(logits, 1, 2.5);
  const at::Tensor expected_warm = torch::softmax(logits[1] / 2.5, 0);
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_NEAR(plain[j], expected[j].item<float>(), 1e-6);
    EXPECT_NEAR(warm[j], expected_warm[j].item<float>(), 1e-6);
  }
  EXPECT_LT(*std::max_element(warm.begin(), warm.end()), *std::max_element(plain.begin(), plain.end()));

  Manifest m;
  m.tags = {"O", "B-PER", "I-PER"};
  CrfScores crf;
  crf.start = {0.5f, -0.25f, -2.0f};
  crf.end = {0.1f, 0.2f, 0.3f};
  crf.transitions = {0.3f, 0.1f, -3.0f, -0.2f, 0.1f, 1.5f, 0.2f, -0.5f, 0.4f};
  CrfScores halved = crf;
  for (auto* v : {&halved.start, &halved.end, &halved.transitions}) {
    for (float& x : *v) x /= 2;
  }
  const at::Tensor tags = torch::tensor({0, 1, 2, 0}, torch::kLong).reshape({1, 4});
  const at::Tensor emissions = torch::randn({1, 4, 3});
  TextResult r = FourTokens();
  DecodeTagging(m, tags, emissions, 0, "ab cd ef gh", r, &crf, 2.0);
  ASSERT_EQ(r.spans.size(), 1u);
  const at::Tensor e = (emissions[0] / 2).contiguous();
  const std::vector<float> marginals = CrfMarginals(halved, e.data_ptr<float>(), 4, 3, 1);
  EXPECT_NEAR(r.spans[0].score, (marginals[1 * 3 + 1] + marginals[2 * 3 + 2]) / 2, 1e-6);
  // A CRF of another size than the emissions is refused.
  CrfScores two = crf;
  two.start.resize(2);
  TextResult again = r;
  again.spans.clear();
  EXPECT_THROW(DecodeTagging(m, tags, emissions, 0, "ab cd ef gh", again, &two, 1.0), std::invalid_argument);
}

// options.contributions: each returned label's margin over the mean of the others, each token's share
// of it read from a [B,T,C] contribution output through its strides (a transposed batch here), and
// the rest; a batch whose contributions disagree with the logits is refused.
TEST(FillContributionsTest, SplitsEachReturnedLabelsMarginOverTheTokens) {
  Manifest m;
  m.labels = {"neg", "neu", "pos"};
  torch::manual_seed(5);
  const at::Tensor share = torch::randn({2, 4, 3});
  const at::Tensor bias = torch::tensor({0.5f, -0.25f, 0.125f});
  at::Tensor mask = torch::ones({2, 4});
  mask[1].slice(0, 3).zero_();  // text 1 has 3 tokens
  const at::Tensor contribution = (share * mask.unsqueeze(-1)).transpose(0, 1).contiguous().transpose(0, 1);
  ModelOutputs outputs;
  outputs[Output::kLogits] = contribution.sum(1) + bias;
  outputs[Output::kContribution] = contribution;
  auto margin = [](const at::Tensor& v, int64_t y) {  // v[..., C]
    return (v.select(-1, y) - (v.sum(-1) - v.select(-1, y)) / 2).item<float>();
  };
  TextResult result;
  result.tokens.resize(3);
  result.labels = TopK(SoftmaxRow(outputs.at(Output::kLogits), 1), m.labels, 2);
  FillContributions(m, outputs, 1, result);
  ASSERT_EQ(result.margins.size(), 2u);
  ASSERT_EQ(result.contribution_rest.size(), 2u);
  for (size_t j = 0; j < 2; ++j) {
    const int64_t y = std::find(m.labels.begin(), m.labels.end(), result.labels[j].first) - m.labels.begin();
    EXPECT_NEAR(result.margins[j], margin(outputs.at(Output::kLogits)[1], y), 1e-5);
    EXPECT_NEAR(result.contribution_rest[j], margin(bias, y), 1e-5);
    float carried = 0;
    for (int64_t t = 0; t < 3; ++t) {
      ASSERT_EQ(result.tokens[t].contribution.size(), 2u);
      EXPECT_NEAR(result.tokens[t].contribution[j], margin(contribution[1][t], y), 1e-6);
      carried += result.tokens[t].contribution[j];
    }
    EXPECT_NEAR(carried + result.contribution_rest[j], result.margins[j], 1e-5);
    EXPECT_TRUE(result.tokens[0].sentence_contribution.empty());
  }
  // The best label argues for itself: its margin is positive.
  EXPECT_GT(result.margins[0], 0);
  ModelOutputs wrong = outputs;
  wrong[Output::kContribution] = torch::zeros({2, 4, 2});
  EXPECT_THROW(FillContributions(m, wrong, 1, result), std::invalid_argument);
  wrong[Output::kContribution] = torch::zeros({2, 2, 3});  // fewer positions than the text's tokens
  EXPECT_THROW(FillContributions(m, wrong, 1, result), std::out_of_range);
  TextResult unknown = result;
  unknown.labels = {{"other", 1.0f}};
  EXPECT_THROW(FillContributions(m, outputs, 1, unknown), std::out_of_range);
}

}  // namespace
}  // namespace qvi

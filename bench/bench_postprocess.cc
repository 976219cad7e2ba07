// Post-processing one text of a batch, in nanoseconds (Google Benchmark): the softmax and top-k of a
// classifier's logits row, and a tagger's tags and spans, as the server computes them (over the row's
// memory: server/core/serving/postprocess.h). One iteration answers every row of a batch of 32, ~24
// tokens a text; `allocs` counts operator new's allocations per row (torch's tensor storage is
// allocated otherwise and not counted).
//
//   Classify/C    the labels of each row, C labels (2: the demo classifier; 20: the topic one)
//   Tag           DecodeTagging over each row: 24 tokens, 9 BIO tags, no CRF (each token's softmax)
//   TagCrf        the same with a CRF: each entity's score from the forward-backward marginals (issue 77:
//                 one confidence per entity, computed for every answer)
//
// Run: build/qvi-bench-postprocess [--benchmark_min_time=0.3]; docs/performance.md, "Post-processing
// without torch", has the results and the command. The code it replaced (through torch's operations
// per row) was measured against it at commit f857303 (bench/results/postprocess-2026-11-27.txt); no
// copy of it is kept here.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "server/core/serving/postprocess.h"
#include "server/core/text/spans.h"
#include "tests/cpp/test_util/count_allocations.h"

namespace qvi {
namespace {

constexpr int64_t kBatch = 32, kTokens = 24;

double PerRow(int64_t count, const benchmark::State& state) {
  return static_cast<double>(count) / static_cast<double>(state.iterations() * kBatch);
}

std::vector<std::string> Labels(int64_t c) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < c; ++i) out.push_back("label-" + std::to_string(i));
  return out;
}

void Classify(benchmark::State& state) {
  const at::Tensor logits = torch::randn({kBatch, state.range(0)});
  const std::vector<std::string> labels = Labels(state.range(0));
  const int64_t allocs = testing::Allocations();
  for (auto _ : state) {
    for (int64_t row = 0; row < kBatch; ++row) benchmark::DoNotOptimize(TopK(SoftmaxRow(logits, row), labels, 1));
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["allocs"] = PerRow(testing::Allocations() - allocs, state);
}

struct Tagging {
  Manifest manifest;
  at::Tensor tags = torch::randint(0, 9, {kBatch, kTokens}, torch::kLong);
  at::Tensor emissions = torch::randn({kBatch, kTokens, 9});
  TextResult result;
  std::string text = std::string(kTokens * 5, 'a');
  Tagging() {
    manifest.tags = {"O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"};
    for (int64_t t = 0; t < kTokens; ++t) {
      TokenOutput out;
      out.token.byte_start = static_cast<uint32_t>(t * 5);
      out.token.byte_end = out.token.byte_start + 4;
      result.tokens.push_back(out);
    }
  }
};

void TagWith(benchmark::State& state, const CrfScores* crf) {
  Tagging in;
  const int64_t allocs = testing::Allocations();
  for (auto _ : state) {
    for (int64_t row = 0; row < kBatch; ++row) {
      in.result.spans.clear();
      DecodeTagging(in.manifest, in.tags, in.emissions, row, in.text, in.result, crf, /*temperature=*/1.45);
      benchmark::DoNotOptimize(in.result);
    }
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["allocs"] = PerRow(testing::Allocations() - allocs, state);
}
void Tag(benchmark::State& state) { TagWith(state, nullptr); }
void TagCrf(benchmark::State& state) {
  CrfScores crf;
  const at::Tensor scores = torch::randn({9 * 9 + 2 * 9});
  const float* v = scores.data_ptr<float>();
  crf.start.assign(v, v + 9);
  crf.end.assign(v + 9, v + 18);
  crf.transitions.assign(v + 18, v + 18 + 81);
  TagWith(state, &crf);
}

BENCHMARK(Classify)->Arg(2)->Arg(20);
BENCHMARK(Tag);
BENCHMARK(TagCrf);

}  // namespace
}  // namespace qvi

int main(int argc, char** argv) {
  at::set_num_threads(1);
  torch::manual_seed(1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}

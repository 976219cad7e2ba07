// Post-processing one text of a batch, in nanoseconds (Google Benchmark): the softmax and top-k of a
// classifier's logits row, and a tagger's tags and spans, as the server computes them now (over the
// row's memory: server/core/serving/postprocess.h) and as it did before through torch's dispatcher (a
// select, a conversion, a softmax and a contiguous copy per row; kept here as the baseline). One
// iteration answers every row of a batch of 32, ~24 tokens a text; `allocs` counts operator new's
// allocations per row (torch's tensor storage is allocated otherwise and not counted).
//
//   Classify/C    the labels of each row, C labels (2: the demo classifier; 20: the topic one)
//   ClassifyTorch/C   the same through torch's operations, per row
//   Tag           DecodeTagging over each row: 24 tokens, 9 BIO tags
//   TagTorch      the same as DecodeTagging did it before, through torch's operations per row
//
// Run: build/qvi-bench-postprocess [--benchmark_min_time=0.3]; docs/performance.md, "Post-processing
// without torch", has the results and the command.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <numeric>
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

// The server's TopK before: softmax of the row through torch, then the stable sort.
std::vector<std::pair<std::string, float>> TopKThroughTorch(const torch::Tensor& logits,
                                                            const std::vector<std::string>& labels, int k) {
  const torch::Tensor probs = torch::softmax(logits.to(torch::kFloat), 0).contiguous();
  const float* p = probs.data_ptr<float>();
  const int c = static_cast<int>(probs.numel());
  std::vector<int> order(c);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [p](int a, int b) { return p[a] > p[b]; });
  const int keep = k <= 0 ? 1 : std::min(k, c);
  std::vector<std::pair<std::string, float>> out;
  for (int i = 0; i < keep; ++i) out.emplace_back(labels[order[i]], p[order[i]]);
  return out;
}

void Classify(benchmark::State& state) {
  const torch::Tensor logits = torch::randn({kBatch, state.range(0)});
  const std::vector<std::string> labels = Labels(state.range(0));
  const int64_t allocs = testing::Allocations();
  for (auto _ : state) {
    for (int64_t row = 0; row < kBatch; ++row) benchmark::DoNotOptimize(TopK(SoftmaxRow(logits, row), labels, 1));
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["allocs"] = PerRow(testing::Allocations() - allocs, state);
}

void ClassifyTorch(benchmark::State& state) {
  const torch::Tensor logits = torch::randn({kBatch, state.range(0)});
  const std::vector<std::string> labels = Labels(state.range(0));
  const int64_t allocs = testing::Allocations();
  for (auto _ : state) {
    for (int64_t row = 0; row < kBatch; ++row) benchmark::DoNotOptimize(TopKThroughTorch(logits[row], labels, 1));
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["allocs"] = PerRow(testing::Allocations() - allocs, state);
}

struct Tagging {
  Manifest manifest;
  torch::Tensor tags = torch::randint(0, 9, {kBatch, kTokens}, torch::kLong);
  torch::Tensor emissions = torch::randn({kBatch, kTokens, 9});
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

// The server's DecodeTagging before: the row's tags, and its tag probabilities through torch.
void DecodeTaggingThroughTorch(const Manifest& manifest, const torch::Tensor& tags, const torch::Tensor& emissions,
                               int64_t row, const std::string& text, TextResult& result) {
  const int64_t n = static_cast<int64_t>(result.tokens.size());
  const torch::Tensor tag_tensor = tags[row].contiguous();
  auto tag_row = tag_tensor.accessor<int64_t, 1>();
  const torch::Tensor probs = torch::softmax(emissions[row].slice(0, 0, n).to(torch::kFloat), 1).contiguous();
  auto prob = probs.accessor<float, 2>();
  std::vector<std::string> names(n);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t id = tag_row[t];
    names[t] = (id >= 0 && id < static_cast<int64_t>(manifest.tags.size())) ? manifest.tags[id] : "O";
    result.tokens[t].tag = names[t];
  }
  for (const TagSpan& s : DecodeSpans(names)) {
    SpanOutput span;
    span.label = s.type;
    const TextToken& first = result.tokens[s.start].token;
    const TextToken& last = result.tokens[s.end - 1].token;
    span.start = first.start;
    span.end = last.end;
    span.byte_start = first.byte_start;
    span.byte_end = last.byte_end;
    span.token_start = static_cast<uint32_t>(s.start);
    span.token_end = static_cast<uint32_t>(s.end);
    span.text = text.substr(span.byte_start, span.byte_end - span.byte_start);
    float sum = 0;
    for (int t = s.start; t < s.end; ++t) sum += prob[t][std::max<int64_t>(tag_row[t], 0)];
    span.score = sum / static_cast<float>(s.end - s.start);
    result.spans.push_back(std::move(span));
  }
}

template <void (*Decode)(const Manifest&, const torch::Tensor&, const torch::Tensor&, int64_t, const std::string&,
                         TextResult&)>
void TagWith(benchmark::State& state) {
  Tagging in;
  const int64_t allocs = testing::Allocations();
  for (auto _ : state) {
    for (int64_t row = 0; row < kBatch; ++row) {
      in.result.spans.clear();
      Decode(in.manifest, in.tags, in.emissions, row, in.text, in.result);
      benchmark::DoNotOptimize(in.result);
    }
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["allocs"] = PerRow(testing::Allocations() - allocs, state);
}
void Tag(benchmark::State& state) { TagWith<DecodeTagging>(state); }
void TagTorch(benchmark::State& state) { TagWith<DecodeTaggingThroughTorch>(state); }

BENCHMARK(Classify)->Arg(2)->Arg(20);
BENCHMARK(ClassifyTorch)->Arg(2)->Arg(20);
BENCHMARK(Tag);
BENCHMARK(TagTorch);

}  // namespace
}  // namespace qvi

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  torch::manual_seed(1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}

// An HTTP/JSON request body's decoding, apart from the server: ParseBody's one walk
// (server/http/native/json_body.h) against what it replaced, the scan and then protobuf's own converter
// (JsonStringToMessage), on the bodies qvi-perf sends (Google Benchmark).
//
//   OneWalk/N        ParseBody on a Classify body of N ~20-word texts.
//   ScanThenProto/N  ScanBody, then JsonStringToMessage, on the same body.
//
// Beside the time, `allocs` is heap allocations per iteration (operator new, counted here).
// Run: build/qvi-bench-json-body [--benchmark_min_time=0.3]; results and the command that made them
// are in docs/performance.md ("The cost of serving itself").
#include <benchmark/benchmark.h>
#include <google/protobuf/util/json_util.h>

#include <string>

#include "qvi/serving/v1/inference.pb.h"
#include "server/http/native/json_body.h"
#include "tests/cpp/test_util/count_allocations.h"

namespace qvi {
namespace {

constexpr int kMaxTexts = 256;

std::string Body(int texts) {
  std::string body = R"({"texts":[)";
  for (int i = 0; i < texts; ++i) {
    if (i > 0) body += ',';
    body += R"("the film is a charming and often affecting journey of a young woman who finds herself through art")";
  }
  return body + R"(],"options":{"topK":2}})";
}

void OneWalk(benchmark::State& state) {
  const std::string body = Body(static_cast<int>(state.range(0)));
  const int64_t before = testing::Allocations();
  for (auto _ : state) {
    serving::v1::ClassifyRequest request;
    if (!ParseBody(body, kMaxTexts, &request).ok()) state.SkipWithError("refused");
    benchmark::DoNotOptimize(request);
  }
  state.counters["allocs"] =
      benchmark::Counter(static_cast<double>(testing::Allocations() - before), benchmark::Counter::kAvgIterations);
}

void ScanThenProto(benchmark::State& state) {
  const std::string body = Body(static_cast<int>(state.range(0)));
  const int64_t before = testing::Allocations();
  for (auto _ : state) {
    serving::v1::ClassifyRequest request;
    google::protobuf::util::JsonParseOptions options;
    if (!ScanBody(body, kMaxTexts).ok() || !google::protobuf::util::JsonStringToMessage(body, &request, options).ok()) {
      state.SkipWithError("refused");
    }
    benchmark::DoNotOptimize(request);
  }
  state.counters["allocs"] =
      benchmark::Counter(static_cast<double>(testing::Allocations() - before), benchmark::Counter::kAvgIterations);
}

BENCHMARK(OneWalk)->Arg(1)->Arg(32);
BENCHMARK(ScanThenProto)->Arg(1)->Arg(32);

}  // namespace
}  // namespace qvi

BENCHMARK_MAIN();

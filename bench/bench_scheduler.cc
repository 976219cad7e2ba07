// The batch queue's own cost, apart from any model: BatchScheduler::TakeBatch at queue sizes
// 16, 1k and 10k (Google Benchmark).
//
//   TakeIdle/N  a TakeBatch that forms nothing: N texts queued, none due (the oldest has not waited
//               max_queue_delay and no limit closes a batch). What every instance thread pays each
//               time it wakes without work.
//   TakeFull/N  a TakeBatch that forms a batch of 16 from N queued texts of mixed lengths, then the
//               batch's requests queued again, so that the queue stays at N.
//
// Beside the time, `allocs` is heap allocations per iteration (operator new, counted here).
// Run: build/qvi-bench-scheduler [--benchmark_min_time=0.2]; results and the command that made them
// are in docs/performance.md ("The batch queue").
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "server/core/base/env.h"
#include "server/core/sched/batch_scheduler.h"
#include "tests/cpp/test_util/count_allocations.h"

namespace qvi {
namespace {

// A clock that does not move: nothing becomes due by waiting.
class StillEnv final : public Env {
 public:
  absl::Time Now() const override { return absl::UnixEpoch() + absl::Hours(1); }
  void WaitUntil(CondVar*, Mutex*, absl::Time) const override {}
};

using Scheduler = BatchScheduler<BatchRequest>;

std::vector<std::shared_ptr<BatchRequest>> Requests(int n) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> length(4, 64);
  std::vector<std::shared_ptr<BatchRequest>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_shared<BatchRequest>(std::vector<int>{length(rng)}, absl::InfiniteFuture(), nullptr,
                                                 [](absl::Status) {}));
  }
  return out;
}

std::unique_ptr<Scheduler> Filled(const BatchSchedulerOptions& o, const Env* env,
                                  const std::vector<std::shared_ptr<BatchRequest>>& requests) {
  std::unique_ptr<Scheduler> s = *Scheduler::Create(o, env);
  for (const auto& r : requests) {
    if (!s->Enqueue(r).ok()) std::abort();
  }
  return s;
}

// Room for 10k texts, and a delay that never passes: only a limit makes a batch due.
BatchSchedulerOptions Roomy(int max_batch_size, int max_batch_tokens) {
  BatchSchedulerOptions o;
  o.max_batch_size = max_batch_size;
  o.max_batch_tokens = max_batch_tokens;
  o.max_queue_delay = absl::Hours(1);
  o.max_queued_texts = 1 << 16;
  o.max_queued_tokens = int64_t{1} << 32;
  return o;
}

void TakeIdle(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  StillEnv env;
  // Limits no queue of this size reaches: nothing is ever due.
  const BatchSchedulerOptions o = Roomy(1 << 16, 1 << 24);
  const auto requests = Requests(n);
  std::unique_ptr<Scheduler> s = Filled(o, &env, requests);
  const int64_t before = testing::Allocations();
  for (auto _ : state) {
    Scheduler::Batch batch = s->TakeBatch();
    if (!batch.empty()) std::abort();
    benchmark::DoNotOptimize(batch);
  }
  state.counters["allocs"] =
      benchmark::Counter(static_cast<double>(testing::Allocations() - before), benchmark::Counter::kAvgIterations);
}

void TakeFull(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  StillEnv env;
  const BatchSchedulerOptions o = Roomy(16, 1 << 20);
  const auto requests = Requests(n);
  std::unique_ptr<Scheduler> s = Filled(o, &env, requests);
  const int64_t before = testing::Allocations();
  for (auto _ : state) {
    Scheduler::Batch batch = s->TakeBatch();
    if (batch.size() != 16) std::abort();
    for (auto& text : batch) {
      if (!s->Enqueue(text.request).ok()) std::abort();
    }
  }
  state.counters["allocs"] =
      benchmark::Counter(static_cast<double>(testing::Allocations() - before), benchmark::Counter::kAvgIterations);
}

BENCHMARK(TakeIdle)->Arg(16)->Arg(1000)->Arg(10000);
BENCHMARK(TakeFull)->Arg(16)->Arg(1000)->Arg(10000);

}  // namespace
}  // namespace qvi

BENCHMARK_MAIN();

// Every default of how a model version is served, in one place. The manifest's `serving` block
// (Manifest::serving), the effective settings (ServingConfig) and the batch queue
// (BatchScheduler::Options) all start from these; a model's manifest and its serving.json refine
// them (serving_config.h). GetModel reports the effective values, and docs/serving.md's
// "Batching knobs" table lists these.
#ifndef QVI_SERVER_CORE_SCHED_DEFAULTS_H_
#define QVI_SERVER_CORE_SCHED_DEFAULTS_H_

#include <cstdint>

namespace qvi::defaults {

// Texts and tokens (padded) in one forward pass.
inline constexpr int kMaxBatchSize = 32;
inline constexpr int kMaxBatchTokens = 4096;
// How long the oldest queued text may wait for a batch to fill.
inline constexpr double kMaxQueueDelayMs = 2.0;
// Texts and tokens a version's queue holds before it refuses (RESOURCE_EXHAUSTED).
inline constexpr int kMaxQueuedTexts = 1024;
inline constexpr int64_t kMaxQueuedTokens = int64_t{1} << 17;
// How much later a text counts as having arrived, per priority level below high, when the queue
// picks the text a batch starts from (batch_scheduler.h): a low-priority text (two levels below)
// waits at most 200 ms longer for its turn than a high-priority one that came with it.
inline constexpr double kPriorityAgingMs = 100.0;
// An idle instance takes what is queued at once instead of waiting max_queue_delay_ms.
inline constexpr bool kBatchWhenIdle = true;
// A version placed on a GPU: a forward there costs about the same for 1 text as for 32, and a batch
// of 256 is 2.3x one of 32 in texts/s (the demo classifier on an H200, BENCHMARKS.md "On a GPU"), so
// batches are larger and the queues hold a few of them. A manifest's `serving.cuda` block or
// serving.json set other values; the queue flags (--max-queued-texts) apply to every device.
inline constexpr int kGpuMaxBatchSize = 256;
inline constexpr int kGpuMaxBatchTokens = 32768;
inline constexpr int kGpuMaxQueuedTexts = 16384;
inline constexpr int64_t kGpuMaxQueuedTokens = int64_t{1} << 21;
// Models on a GPU replay CUDA graphs captured at load (--cuda-graphs, serving.json "cuda_graphs").
inline constexpr bool kCudaGraphs = true;

}  // namespace qvi::defaults

#endif  // QVI_SERVER_CORE_SCHED_DEFAULTS_H_

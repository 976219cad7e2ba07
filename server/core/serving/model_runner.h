// Runs one model version: its BatchScheduler and `instances` threads, each of which takes the next
// due batch, runs it through the model, and hands every text its row of the outputs.
//
// Contract:
//  1. Enqueue() refuses at once (RESOURCE_EXHAUSTED) when the scheduler's queue is full.
//  2. Every text of an accepted request is completed exactly once: with its row (OK), with the
//     model's error (INTERNAL for that batch only), or dropped as expired / cancelled.
//  3. Stop() takes no new work, runs every queued text (ignoring the queue delay), and joins.
//  4. Nothing is called out of the runner under its lock: done-callbacks, row handlers and the
//     observer run on an instance thread (or the caller's) with no runner or scheduler lock held.
//     A row handler or the observer's OnBatch that throws fails the texts concerned with INTERNAL
//     (OnQueueDepth's failure is logged); the thread goes on serving. (The scheduler's cancellation probe,
//     is_cancelled, is the one call made under a lock: it must be cheap and must not block.)
// Threads: one per instance; torch's own intra-op threads come on top (set per process). On a GPU
// each instance thread runs on a CUDA stream of its own (DeviceStreamScope).
#ifndef QVI_SERVER_CORE_SERVING_MODEL_RUNNER_H_
#define QVI_SERVER_CORE_SERVING_MODEL_RUNNER_H_

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/core/manifest/serving_config.h"
#include "server/core/model/model.h"
#include "server/core/sched/batch_scheduler.h"
#include "server/core/sched/sync.h"
#include "server/core/serving/observer.h"

namespace qvi {

// A request's texts as token ids, the outputs it needs, and what to do with each text's row.
class RunnableRequest final : public BatchRequest {
 public:
  using RowHandler = std::function<absl::Status(int index, const ModelOutputs& outputs, int64_t row)>;

  // `wanted`: the model tensors it needs (outputs.h); `selection`: the layers and heads it wants of
  // the per-layer outputs (empty = all).
  RunnableRequest(std::vector<std::vector<int64_t>> ids, OutputSet wanted, absl::Time deadline,
                  std::function<bool()> is_cancelled, RowHandler on_row, std::function<void(absl::Status)> on_done,
                  OutputSelection selection = {});

  const std::vector<int64_t>& ids(int index) const { return ids_[index]; }
  const OutputSet& wanted() const { return wanted_; }
  const OutputSelection& selection() const { return selection_; }
  // options.faithfulness.top_k (0: no check); set once, before the request is enqueued.
  int faithfulness_top_k() const { return faithfulness_top_k_; }
  void set_faithfulness_top_k(int k) { faithfulness_top_k_ = k; }
  bool wants_layers() const { return wants_layers_; }

  // Where its time went: when its first text joined the queue, the longest wait of its texts in
  // the queue, and the longest batch it was in (forward and post-processing, and each of the two).
  // Recorded before each text completes; read in on_done.
  struct Timing {
    absl::Time queued = absl::InfiniteFuture();
    absl::Duration queue;
    absl::Duration compute;
    absl::Duration forward;
    absl::Duration postprocess;
  };
  // One text's share: it joined the queue at `queued` and waited `queue`; its batch ran its
  // forward pass for `forward`, then the rows' post-processing for `postprocess`.
  void RecordTiming(absl::Time queued, absl::Duration queue, absl::Duration forward, absl::Duration postprocess)
      ABSL_LOCKS_EXCLUDED(timing_mu_);
  Timing timing() const ABSL_LOCKS_EXCLUDED(timing_mu_);
  absl::Status HandleRow(int index, const ModelOutputs& outputs, int64_t row) const {
    return on_row_(index, outputs, row);
  }

 private:
  static std::vector<int> Counts(const std::vector<std::vector<int64_t>>& ids);

  const std::vector<std::vector<int64_t>> ids_;
  const OutputSet wanted_;
  const RowHandler on_row_;
  const OutputSelection selection_;
  const bool wants_layers_;
  int faithfulness_top_k_ = 0;
  mutable Mutex timing_mu_;
  Timing timing_ ABSL_GUARDED_BY(timing_mu_);
};

// The batch queue's settings of a version: its effective ServingConfig's batching and queue limits.
BatchSchedulerOptions BatchingOptions(const ServingConfig& serving);

// Texts of token ids padded into one batch, as Model::Forward takes them.
struct PackedBatch {
  torch::Tensor ids;   // [rows, width] int64, zero after each text's end
  torch::Tensor mask;  // [rows, width] bool, true on each text's tokens
  int64_t tokens = 0;  // real tokens, padding left out
};

// width = the longest text, at least 1 (a batch of empty texts still has one column). The runner
// and the in-process benchmark (bench/bench_model.cc) both pack with it.
PackedBatch PackTokenIds(const std::vector<const std::vector<int64_t>*>& texts);

class ModelRunner {
 public:
  using Scheduler = BatchScheduler<RunnableRequest>;
  using Batch = Scheduler::Batch;

  // The runner of one version as `serving` sets it: its batching (BatchingOptions), instances and
  // batching mode. INVALID_ARGUMENT when the batch queue refuses the settings.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(std::shared_ptr<const Model> model, int64_t version,
                                                             const ServingConfig& serving, const Env* env,
                                                             ServingObserver* observer);

  // `observer` (may be null) hears of every batch and queue change of this version. `batching`
  // says whether an idle instance takes the next batch at once or waits for the scheduler's
  // max_queue_delay (BatchingMode; no default here: the caller passes the version's setting).
  ModelRunner(std::shared_ptr<const Model> model, int64_t version, std::unique_ptr<Scheduler> scheduler, const Env* env,
              int instances, ServingObserver* observer, BatchingMode batching);
  ~ModelRunner();

  absl::Status Enqueue(std::shared_ptr<RunnableRequest> request) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  // One batch, in named steps: what its texts want together, their ids packed, the forward pass,
  // each text its row, the report; then each text completes.
  void Run(Batch& batch) const;
  // The outputs any text of the batch wants, and the layers and heads of the per-layer ones.
  struct Wanted {
    OutputSet outputs;
    OutputSelection selection;
  };
  static Wanted MergeWanted(const Batch& batch);
  static PackedBatch Pack(const Batch& batch);
  // Hands each text its row of `outputs`; a handler's failure (or exception) fails its text only.
  static std::vector<absl::Status> DeliverRows(const Batch& batch, const ModelOutputs& outputs);
  // options.faithfulness: each asking text with α's top-k tokens deleted, run as one more forward
  // (logits only) into outputs.check_*. Its error fails the asking texts only.
  absl::Status RunChecks(const Batch& batch, ModelOutputs& outputs) const;
  // Records where each request's time went and tells the observer; an observer that throws fails
  // the whole batch (INTERNAL naming the hook).
  absl::Status Report(const Batch& batch, const PackedBatch& packed, absl::Time start, absl::Time forward_end,
                      absl::Duration device, bool ok) const;

  // Calls the observer (when there is one); an exception becomes INTERNAL naming the hook.
  absl::Status Observe(const char* hook, const std::function<void()>& call) const;
  void ReportQueueDepth() const;

  const std::shared_ptr<const Model> model_;
  const int64_t version_;
  const std::unique_ptr<Scheduler> scheduler_;
  ServingObserver* const observer_;
  const BatchingMode batching_;
  const Env* env_;
  Mutex mu_;
  CondVar work_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t work_seq_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by every Enqueue and by Stop
  std::vector<std::thread> threads_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_MODEL_RUNNER_H_

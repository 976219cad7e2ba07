// Runs one model version: its BatchScheduler and `instances` threads, each of which takes the next
// due batch, runs it through the model, and hands every text its row of the outputs.
//
// The answers (each row's post-processing and each request's completion: serialising, sending,
// logging) are made off the instance thread when an answer pool is given: the instance thread packs
// a batch, runs the forward pass, copies the outputs off the device, reports the batch, hands the rows
// to the pool in chunks and goes back for the next batch. It makes them itself when there is no pool,
// or when the batch is one chunk and nothing waits in the queue (a hand-off would only add a thread's
// wake-up to the answer). At most `2 x instances` batches of a runner are being answered at once: an
// instance thread that would exceed it waits (back-pressure, not a growing backlog).
//
// Batches are pipelined where the device computes on its own (Model::asynchronous(): a GPU, the
// null model's emulated device): the instance thread forms and launches batch k+1 -- packed into
// pinned memory, copied and run on its stream without waiting -- before it collects batch k, so
// the device has the next batch queued while the host waits for the last one's outputs and hands
// them out. At most one batch per instance thread is launched and not yet collected; when nothing
// is due the one in flight is collected at once. On the CPU a launch computes the whole batch, and
// each batch is collected as soon as it is launched, as before.
//
// Contract:
//  1. Enqueue() refuses at once (RESOURCE_EXHAUSTED) when the scheduler's queue is full.
//  2. Every text of an accepted request is completed exactly once: with its row (OK), with the
//     model's error (INTERNAL for that batch only), or dropped as expired / cancelled.
//  3. Stop() takes no new work, runs every queued text (ignoring the queue delay), joins, and
//     returns after the last answer of its batches is made.
//  4. Nothing is called out of the runner under its lock: done-callbacks, row handlers and the
//     observer run on an instance thread, an answer thread (or the caller's) with no runner or
//     scheduler lock held. Row handlers of one request may run at once on different threads, each
//     for a different text.
//     A row handler or the observer's OnBatch that throws fails the texts concerned with INTERNAL
//     (OnQueueDepth's failure is logged); the thread goes on serving. (The scheduler's cancellation probe,
//     is_cancelled, is the one call made under a lock: it must be cheap and must not block.)
// Threads: one per instance; torch's own intra-op threads come on top (set per process); the answer
// pool is shared by every runner (the server's, sized to the CPUs). On a GPU each instance thread
// runs on a CUDA stream of its own (DeviceStreamScope).
#ifndef QVI_SERVER_CORE_RUNNER_MODEL_RUNNER_H_
#define QVI_SERVER_CORE_RUNNER_MODEL_RUNNER_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/core/base/sync.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/model/model.h"
#include "server/core/runner/observer.h"
#include "server/core/sched/batch_scheduler.h"
#include "server/core/sched/executor.h"

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
  // The rows that are the request's own texts, the first `texts` (the rest are options.occlusion's
  // variants of them, which get no faithfulness check); all of them unless set, once, before it is
  // enqueued.
  int texts() const { return texts_; }
  void set_texts(int texts) { texts_ = texts; }
  // Whether row `index` takes the faithfulness check: a text of its own, of a request that asked.
  bool Checks(int index) const { return faithfulness_top_k_ > 0 && index < texts_; }
  bool wants_layers() const { return wants_layers_; }
  // The call's span when its trace is exported (a batch's span links to it); set once, before the
  // request is enqueued.
  const std::optional<SpanRef>& span() const { return span_; }
  void set_span(std::optional<SpanRef> span) { span_ = span; }

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
  int texts_;
  std::optional<SpanRef> span_;
  mutable Mutex timing_mu_;
  Timing timing_ ABSL_GUARDED_BY(timing_mu_);
};

// The batch queue's settings of a version: its effective ServingConfig's batching and queue limits.
BatchSchedulerOptions BatchingOptions(const ServingConfig& serving);

// Texts of token ids padded into one batch, as Model::Forward takes them.
struct PackedBatch {
  at::Tensor ids;      // [rows, width] int64, zero after each text's end
  at::Tensor mask;     // [rows, width] bool, true on each text's tokens
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
                                                             ServingObserver* observer, Executor* answers = nullptr,
                                                             bool pipeline = true);

  // `observer` (may be null) hears of every batch and queue change of this version. `batching`
  // says whether an idle instance takes the next batch at once or waits for the scheduler's
  // max_queue_delay (BatchingMode; no default here: the caller passes the version's setting).
  // `answers` (may be null: the instance threads answer) makes the answers; it must outlive the
  // runner or be shut down first (then Submit runs the chunks on the caller's thread). `pipeline`:
  // launch the next batch before collecting the last where the model is asynchronous (false: one
  // batch at a time, for comparison).
  ModelRunner(std::shared_ptr<const Model> model, int64_t version, std::unique_ptr<Scheduler> scheduler, const Env* env,
              int instances, ServingObserver* observer, BatchingMode batching, Executor* answers = nullptr,
              bool pipeline = true);

  // Rows per chunk of answers, at least: fewer would cost a hand-off each for little work.
  static constexpr int64_t kMinChunkRows = 16;
  ~ModelRunner();

  absl::Status Enqueue(std::shared_ptr<RunnableRequest> request) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  // A batch launched on the device and not yet collected: its texts, when it began, its inputs and
  // the launch (or why it failed).
  struct InFlight {
    Batch batch;
    absl::Time start;
    PackedBatch packed;
    absl::StatusOr<LaunchedForward> launched;
  };
  // A batch's first half, on the instance thread: what its texts want together, their ids packed,
  // the forward pass launched (Model::Launch). Takes the batch only when nothing threw.
  std::optional<InFlight> Launch(Batch& batch) const;
  // Its second half: the outputs collected (Model::Collect), the faithfulness checks, the report;
  // then the answers (Answer), here or on the answer pool.
  void Run(InFlight& flight) ABSL_LOCKS_EXCLUDED(answering_mu_);
  // Run, with a failure that escapes it (bad_alloc) failing the batch's texts that were not yet
  // handed to the answers.
  void Settle(std::optional<InFlight> flight) ABSL_LOCKS_EXCLUDED(answering_mu_);
  // Completes every text of `batch` with INTERNAL: `what` and the exception being handled.
  static void Fail(Batch& batch, const char* what);
  // A batch whose answers are being made: shared by its chunks, the last one done lets it go.
  struct Answering;
  // Rows [begin, end) of a batch: each its row of the outputs (where its status is still OK), the
  // time recorded, then each text completed; then the observer's OnAnswers. Never throws.
  void Answer(Answering& a, size_t begin, size_t end) const;
  // How many chunks the pool makes of a batch of `rows`; 0: the instance thread answers it.
  int ChunksFor(size_t rows) const;
  // Counts a batch into (and out of) the ones being answered; Begin waits while the limit is reached.
  void BeginAnswering() ABSL_LOCKS_EXCLUDED(answering_mu_);
  void EndAnswering() ABSL_LOCKS_EXCLUDED(answering_mu_);
  // The outputs any text of the batch wants, and the layers and heads of the per-layer ones.
  struct Wanted {
    OutputSet outputs;
    OutputSelection selection;
  };
  static Wanted MergeWanted(const Batch& batch);
  static PackedBatch Pack(const Batch& batch);
  // Hands texts [begin, end) their rows of `outputs` where their status is OK; a handler's failure
  // (or exception) fails its text only.
  static void DeliverRows(const Batch& batch, const ModelOutputs& outputs, size_t begin, size_t end,
                          std::vector<absl::Status>& statuses);
  // options.faithfulness: each asking text with α's top-k tokens deleted, run as one more forward
  // (logits only) into outputs.check_*. Its error fails the asking texts only.
  absl::Status RunChecks(const Batch& batch, ModelOutputs& outputs) const;
  // Tells the observer of the batch (its queue waits, its turn on the instance thread); an observer
  // that throws fails the whole batch (INTERNAL naming the hook).
  absl::Status Report(const Batch& batch, const PackedBatch& packed, absl::Time start, absl::Time forward_end,
                      absl::Duration device, bool ok) const;

  // Calls the observer (when there is one); an exception becomes INTERNAL naming the hook.
  absl::Status Observe(const char* hook, const std::function<void()>& call) const;
  // The queue's depth now, to the observer. Read and reported under depth_mu_: two reports (an Enqueue's,
  // an instance thread's after taking a batch) cannot land in the other order than they read, which left
  // the gauge at 1 over an empty queue until the next change.
  void ReportQueueDepth() const ABSL_LOCKS_EXCLUDED(depth_mu_);

  const std::shared_ptr<const Model> model_;
  const int64_t version_;
  const std::unique_ptr<Scheduler> scheduler_;
  ServingObserver* const observer_;
  const BatchingMode batching_;
  const Env* env_;
  Executor* const answers_;
  const bool pipelined_;     // launches the next batch before collecting the last
  const int max_answering_;  // batches being answered at once
  mutable Mutex depth_mu_;   // orders ReportQueueDepth's calls; taken before the observer's own locks
  Mutex answering_mu_;
  CondVar answered_;
  int answering_ ABSL_GUARDED_BY(answering_mu_) = 0;
  Mutex mu_;
  CondVar work_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t work_seq_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by every Enqueue and by Stop
  std::vector<std::thread> threads_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_RUNNER_MODEL_RUNNER_H_

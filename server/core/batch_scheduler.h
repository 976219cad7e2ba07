// Forms batches of texts for one model from the requests of many callers.
//
// A request's texts wait in one bounded queue (capacity in texts and in tokens). A batch closes at
// whichever comes first:
//   1. max_batch_size texts;
//   2. max_batch_tokens padded tokens (texts x the longest text's tokens);
//   3. the oldest waiting text has waited max_queue_delay.
// So the worst-case queueing delay of a text, with a free model instance, is max_queue_delay.
// Each batch starts from the oldest waiting text (no text starves) and is filled with the waiting
// texts closest to it in length, which cuts padding. A request's texts may go into different
// batches; BatchRequest puts the answer back together and reports it exactly once.
// Expired and cancelled requests are removed when a batch is formed, so their texts never reach
// the model; a request that does not fit in the queue is refused at once (RESOURCE_EXHAUSTED).
//
// Tuning: max_batch_size and max_batch_tokens bound the cost of one forward pass; max_queue_delay
// trades latency at low load for larger batches. The class has no threads of its own: a worker
// calls TakeBatch() when NextDue() comes or a request arrives, and tests step it with a fake clock.
// ModelRunner owns one per model version and runs its batches.
#ifndef QVI_SERVER_CORE_BATCH_SCHEDULER_H_
#define QVI_SERVER_CORE_BATCH_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/clock.h"
#include "server/core/defaults.h"
#include "server/core/sync.h"

namespace qvi {

// One caller's request as the scheduler sees it: the token count of each text, a deadline, a
// cancellation check, and `on_done`, which runs exactly once with OK (every text completed) or the
// first error.
class BatchRequest {
 public:
  virtual ~BatchRequest() = default;
  BatchRequest(std::vector<int> token_counts, absl::Time deadline, std::function<bool()> is_cancelled,
               std::function<void(absl::Status)> on_done);

  const std::vector<int>& token_counts() const { return token_counts_; }
  absl::Time deadline() const { return deadline_; }
  // False once the request has finished: after that the caller's context (and so what
  // is_cancelled reads) may be gone, while another batch still holds this request's texts.
  bool IsCancelled() const ABSL_LOCKS_EXCLUDED(mu_);

  // A text's batch finished with `status`. The last one finishes the request.
  void Complete(int index, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Finishes the request now with `status` (ignored if it has finished already).
  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  bool finished() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::vector<int> token_counts_;
  const absl::Time deadline_;
  const std::function<bool()> is_cancelled_;
  std::function<void(absl::Status)> on_done_;
  mutable Mutex mu_;
  size_t remaining_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// The message of the exception being handled (call only inside a catch block).
std::string CurrentExceptionText();

struct QueuedText {
  std::shared_ptr<BatchRequest> request;
  int index = 0;  // which of the request's texts
  int tokens = 0;
  absl::Time arrival;
};

class BatchScheduler {
 public:
  struct Options {
    int max_batch_size = defaults::kMaxBatchSize;
    int max_batch_tokens = defaults::kMaxBatchTokens;
    absl::Duration max_queue_delay = absl::Microseconds(static_cast<int64_t>(defaults::kMaxQueueDelayMs * 1000));
    int max_queued_texts = defaults::kMaxQueuedTexts;
    int64_t max_queued_tokens = defaults::kMaxQueuedTokens;
  };

  static absl::StatusOr<std::unique_ptr<BatchScheduler>> Create(const Options& options, const Clock* clock);

  // Queues all of the request's texts, or none: RESOURCE_EXHAUSTED at once when they do not fit.
  absl::Status Enqueue(std::shared_ptr<BatchRequest> request) ABSL_LOCKS_EXCLUDED(mu_);

  // The next batch if one is due now (empty otherwise); with `drain`, the next batch whatever the
  // delay (shutdown). Requests found expired or cancelled are failed (DEADLINE_EXCEEDED /
  // CANCELLED) and their texts dropped.
  std::vector<QueuedText> TakeBatch(bool drain = false) ABSL_LOCKS_EXCLUDED(mu_);

  // When the oldest waiting text reaches max_queue_delay (InfiniteFuture when nothing waits).
  absl::Time NextDue() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t queued_texts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  BatchScheduler(const Options& options, const Clock* clock) : options_(options), clock_(clock) {}

  using DeadRequest = std::pair<std::shared_ptr<BatchRequest>, absl::Status>;
  // Removes the texts of finished, cancelled and expired requests; the last two are added to `dead`
  // and failed by the caller once the lock is released.
  void DropDeadLocked(absl::Time now, std::vector<DeadRequest>& dead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<QueuedText> FormBatchAndCollectDead(bool drain, std::vector<DeadRequest>& dead) ABSL_LOCKS_EXCLUDED(mu_);
  // Indices into queue_ of the batch seeded by the oldest text; `full` says a size or token limit
  // (rather than running out of texts) stopped it.
  std::vector<size_t> FormLocked(bool& full) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const Clock* clock_;
  mutable Mutex mu_;
  std::vector<QueuedText> queue_ ABSL_GUARDED_BY(mu_);  // arrival order
  int64_t queued_tokens_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_BATCH_SCHEDULER_H_

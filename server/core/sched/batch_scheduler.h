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
// calls TakeBatch() when NextDue() comes or a request arrives, and tests step it on fake time (FakeEnv).
// ModelRunner owns one per model version and runs its batches.
//
// The scheduler is a template on the request type its owner queues (a BatchRequest or a class
// derived from it), so the batches it hands back hold that type: the runner reads its requests'
// token ids without casting (TF Serving's SharedBatchScheduler<TaskType> does the same).
#ifndef QVI_SERVER_CORE_SCHED_BATCH_SCHEDULER_H_
#define QVI_SERVER_CORE_SCHED_BATCH_SCHEDULER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/sched/defaults.h"
#include "server/core/sched/env.h"
#include "server/core/sched/sync.h"

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

// The batching and queue limits of one scheduler (ModelRunner takes them from a version's
// ServingConfig: BatchingOptions in model_runner.h).
struct BatchSchedulerOptions {
  int max_batch_size = defaults::kMaxBatchSize;
  int max_batch_tokens = defaults::kMaxBatchTokens;
  absl::Duration max_queue_delay = absl::Microseconds(static_cast<int64_t>(defaults::kMaxQueueDelayMs * 1000));
  int max_queued_texts = defaults::kMaxQueuedTexts;
  int64_t max_queued_tokens = defaults::kMaxQueuedTokens;
};

// INVALID_ARGUMENT naming the first setting out of range.
absl::Status CheckBatchSchedulerOptions(const BatchSchedulerOptions& options);

// Which texts of a queue (arrival order) form the batch seeded by the oldest, queue[0]: the ones
// closest to it in length (among equals, the earlier), while the batch stays within max_batch_size
// texts and max_batch_tokens padded tokens. `full` says a limit, rather than running out of texts,
// closed it. Writes indices into `tokens` to `batch`, the seed first; `order` is scratch space.
// Both vectors keep their capacity, so a caller that reuses them allocates nothing once they grew.
void ChooseBatch(const std::vector<int>& tokens, const BatchSchedulerOptions& options, std::vector<size_t>& order,
                 std::vector<size_t>& batch, bool& full);

// Whether the batch ChooseBatch would form from `texts` texts, the longest `longest` tokens, is
// closed by a limit (its `full`), decided without choosing it.
bool BatchWouldBeFull(size_t texts, int longest, const BatchSchedulerOptions& options);

// The refusal and failures every scheduler gives, worded once.
absl::Status BatchQueueFull(size_t queued_texts, int64_t queued_tokens);
absl::Status BatchCancelledWhileQueued();
absl::Status BatchExpiredWhileQueued();

// One text of a queued request.
template <typename Request>
struct QueuedText {
  std::shared_ptr<Request> request;
  int index = 0;  // which of the request's texts
  int tokens = 0;
  absl::Time arrival;
};

// When TakeBatch hands out a batch.
enum class Take {
  kWhenDue,  // only once a limit closes it or its oldest text has waited max_queue_delay
  kNow,      // whatever is queued, at once: an idle instance that batches when idle, and shutdown
};

template <typename Request>
class BatchScheduler {
  static_assert(std::is_base_of_v<BatchRequest, Request>, "the scheduler queues BatchRequests");

 public:
  using Options = BatchSchedulerOptions;
  using Batch = std::vector<QueuedText<Request>>;

  static absl::StatusOr<std::unique_ptr<BatchScheduler>> Create(const Options& options, const Env* env) {
    if (absl::Status s = CheckBatchSchedulerOptions(options); !s.ok()) return s;
    return std::unique_ptr<BatchScheduler>(new BatchScheduler(options, env));
  }

  // Queues all of the request's texts, or none: RESOURCE_EXHAUSTED at once when they do not fit.
  absl::Status Enqueue(std::shared_ptr<Request> request) ABSL_LOCKS_EXCLUDED(mu_) {
    const std::vector<int>& counts = request->token_counts();
    int64_t tokens = 0;
    for (int c : counts) tokens += c;
    MutexLock lock(&mu_);
    if (queue_.size() + counts.size() > static_cast<size_t>(options_.max_queued_texts) ||
        queued_tokens_ + tokens > options_.max_queued_tokens) {
      return BatchQueueFull(queue_.size(), queued_tokens_);
    }
    const absl::Time now = env_->Now();
    for (size_t i = 0; i < counts.size(); ++i) queue_.push_back({request, static_cast<int>(i), counts[i], now});
    queued_tokens_ += tokens;
    return absl::OkStatus();
  }

  // The next batch if one is due now (empty otherwise); with Take::kNow, the next batch whatever
  // the delay. Requests found expired or cancelled are failed (DEADLINE_EXCEEDED / CANCELLED) and
  // their texts dropped.
  Batch TakeBatch(Take when = Take::kWhenDue) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<DeadRequest> dead;
    Batch batch = FormBatchAndCollectDead(when, dead);
    for (auto& [request, status] : dead) request->Fail(status);  // outside the lock
    return batch;
  }

  // When the oldest waiting text reaches max_queue_delay (InfiniteFuture when nothing waits).
  absl::Time NextDue() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return queue_.empty() ? absl::InfiniteFuture() : queue_.front().arrival + options_.max_queue_delay;
  }

  size_t queued_texts() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return queue_.size();
  }

 private:
  BatchScheduler(const Options& options, const Env* env) : options_(options), env_(env) {}

  using DeadRequest = std::pair<std::shared_ptr<Request>, absl::Status>;

  // Removes the texts of finished, cancelled and expired requests in one pass, in place; the last
  // two are added to `dead` and failed by the caller once the lock is released. Returns the longest
  // text left (0 when none). A request's texts sit together in the queue (Enqueue adds them at once
  // and removals keep the order), so a request already found dead is the last one in `dead`.
  int DropDeadLocked(absl::Time now, std::vector<DeadRequest>& dead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int longest = 0;
    size_t kept = 0;
    for (size_t i = 0; i < queue_.size(); ++i) {
      QueuedText<Request>& t = queue_[i];
      const BatchRequest* r = t.request.get();
      bool drop = r->finished() || (!dead.empty() && dead.back().first.get() == r);
      if (!drop && r->IsCancelled()) {
        dead.emplace_back(t.request, BatchCancelledWhileQueued());
        drop = true;
      } else if (!drop && now > r->deadline()) {
        dead.emplace_back(t.request, BatchExpiredWhileQueued());
        drop = true;
      }
      if (drop) {
        queued_tokens_ -= t.tokens;
        continue;
      }
      longest = std::max(longest, t.tokens);
      if (kept != i) queue_[kept] = std::move(t);
      ++kept;
    }
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(kept), queue_.end());
    return longest;
  }

  // Decides whether a batch is due before choosing one: nothing is sorted or allocated when none is.
  // A batch that forms is taken out of the queue in one pass, keeping the rest in order.
  Batch FormBatchAndCollectDead(Take when, std::vector<DeadRequest>& dead) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    const absl::Time now = env_->Now();
    const int longest = DropDeadLocked(now, dead);
    if (queue_.empty()) return {};
    if (when == Take::kWhenDue && now < queue_.front().arrival + options_.max_queue_delay &&
        !BatchWouldBeFull(queue_.size(), longest, options_)) {
      return {};
    }
    tokens_.clear();
    for (const QueuedText<Request>& t : queue_) tokens_.push_back(t.tokens);
    bool full = false;
    ChooseBatch(tokens_, options_, order_, chosen_, full);
    take_.assign(queue_.size(), 0);
    for (size_t i : chosen_) take_[i] = 1;
    Batch batch;
    batch.reserve(chosen_.size());
    size_t kept = 0;
    for (size_t i = 0; i < queue_.size(); ++i) {
      if (take_[i]) {
        queued_tokens_ -= queue_[i].tokens;
        batch.push_back(std::move(queue_[i]));
      } else {
        if (kept != i) queue_[kept] = std::move(queue_[i]);
        ++kept;
      }
    }
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(kept), queue_.end());
    return batch;
  }

  const Options options_;
  const Env* env_;
  mutable Mutex mu_;
  Batch queue_ ABSL_GUARDED_BY(mu_);  // arrival order
  int64_t queued_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  // Scratch space of FormBatchAndCollectDead, kept between batches so that it stops allocating.
  std::vector<int> tokens_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> order_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> chosen_ ABSL_GUARDED_BY(mu_);
  std::vector<char> take_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SCHED_BATCH_SCHEDULER_H_

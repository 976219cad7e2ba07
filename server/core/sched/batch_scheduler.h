// Forms batches of texts for one model from the requests of many callers.
//
// A request's texts wait in one bounded queue (capacity in texts and in tokens). A batch closes at
// whichever comes first:
//   1. max_batch_size texts;
//   2. max_batch_tokens padded tokens (texts x the longest text's tokens);
//   3. the oldest waiting text has waited max_queue_delay.
// So the worst-case queueing delay of a text, with a free model instance, is max_queue_delay.
// Each batch starts from the oldest waiting text (no text starves) and is filled with the waiting
// texts closest to it in length, which cuts padding.
//
// Priorities (priority.h): a text of level p (1 high, 2 normal, 3 low) counts as if it had arrived
// (p - 1) x priority_aging later when the batch's first text (its seed) is chosen, and the rest of the
// batch is filled from the highest level down (closest in length within a level). So a high-priority
// text joins the next batch formed unless that batch fills with high-priority texts, whatever the
// number of lower ones waiting; and no text is passed over as a seed by a higher-level text that
// arrived more than (p - 1) x priority_aging after it (the aging rule: lower levels wait longer, never
// for ever). When the queue is full, a request is queued in the place of lower-priority requests
// (the lowest level first, the newest first), which fail with RESOURCE_EXHAUSTED; with one level in
// use, all of this is the arrival order above. A request's texts may go into different
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
#include "server/core/base/env.h"
#include "server/core/base/sync.h"
#include "server/core/sched/defaults.h"
#include "server/core/sched/priority.h"

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
  // Set once, before the request is enqueued (kDefault queues it as normal).
  Priority priority() const { return priority_; }
  void set_priority(Priority priority) { priority_ = priority; }
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
  Priority priority_ = Priority::kDefault;
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
  // How much later a text counts as having arrived per level below high, when a batch's seed is chosen.
  absl::Duration priority_aging = absl::Milliseconds(defaults::kPriorityAgingMs);
};

// INVALID_ARGUMENT naming the first setting out of range.
absl::Status CheckBatchSchedulerOptions(const BatchSchedulerOptions& options);

// Which texts of a queue (arrival order) form the batch seeded by queue[seed]: the others by level
// (`levels[i]`, 1 the highest; all one level when `levels` is empty), and within a level the closest
// to the seed in length (among equals, the earlier), while the batch stays within max_batch_size
// texts and max_batch_tokens padded tokens. `full` says a limit, rather than running out of texts,
// closed it. Writes indices into `tokens` to `batch`, the seed first; `order` is scratch space.
// Both vectors keep their capacity, so a caller that reuses them allocates nothing once they grew.
void ChooseBatch(const std::vector<int>& tokens, const std::vector<uint8_t>& levels, size_t seed,
                 const BatchSchedulerOptions& options, std::vector<size_t>& order, std::vector<size_t>& batch,
                 bool& full);

// The seed of the next batch: the text whose arrival, put off by (level - 1) x `aging`, is the
// earliest (among equals, the first). `arrivals` in queue order; all one level when `levels` is empty.
size_t ChooseSeed(const std::vector<absl::Time>& arrivals, const std::vector<uint8_t>& levels, absl::Duration aging);

// Whether the batch ChooseBatch would form from `texts` texts, the longest `longest` tokens, is
// closed by a limit (its `full`), decided without choosing it.
bool BatchWouldBeFull(size_t texts, int longest, const BatchSchedulerOptions& options);

// The refusal and failures every scheduler gives, worded once.
absl::Status BatchQueueFull(size_t queued_texts, int64_t queued_tokens);
absl::Status BatchCancelledWhileQueued();
absl::Status BatchExpiredWhileQueued();
// A request of `level` whose place in a full queue a higher-priority request took.
absl::Status BatchShed(int level);

// What Enqueue shed to make room: texts per level (index 1 to kPriorityLevels), and the requests,
// which the holder fails (Fail) once it holds no lock.
template <typename Request>
struct Shed {
  size_t texts[kPriorityLevels + 1] = {};
  std::vector<std::shared_ptr<Request>> requests;
  void Fail() {
    for (const std::shared_ptr<Request>& r : requests) r->Fail(BatchShed(PriorityLevel(r->priority())));
    requests.clear();
  }
};

// One text of a queued request.
template <typename Request>
struct QueuedText {
  std::shared_ptr<Request> request;
  int index = 0;  // which of the request's texts
  int tokens = 0;
  absl::Time arrival;
  uint8_t level = 2;  // the request's PriorityLevel
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

  // Queues all of the request's texts, or none: RESOURCE_EXHAUSTED at once when they do not fit, even
  // once every request of a lower priority is left out. The requests shed to make room (BatchShed) are
  // added to `shed`, whose holder fails them once it holds no lock; without `shed`, they are failed
  // before Enqueue returns.
  absl::Status Enqueue(std::shared_ptr<Request> request, Shed<Request>* shed = nullptr) ABSL_LOCKS_EXCLUDED(mu_) {
    Shed<Request> own;
    absl::Status status = EnqueueOrShed(std::move(request), shed != nullptr ? *shed : own);
    own.Fail();
    return status;
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

  absl::Status EnqueueOrShed(std::shared_ptr<Request> request, Shed<Request>& shed) ABSL_LOCKS_EXCLUDED(mu_) {
    const std::vector<int>& counts = request->token_counts();
    int64_t tokens = 0;
    for (int c : counts) tokens += c;
    const auto level = static_cast<uint8_t>(PriorityLevel(request->priority()));
    MutexLock lock(&mu_);
    const bool fits = queue_.size() + counts.size() <= static_cast<size_t>(options_.max_queued_texts) &&
                      queued_tokens_ + tokens <= options_.max_queued_tokens;
    if (!fits && !ShedLocked(level, counts.size(), tokens, shed)) return BatchQueueFull(queue_.size(), queued_tokens_);
    const absl::Time now = env_->Now();
    for (size_t i = 0; i < counts.size(); ++i) queue_.push_back({request, static_cast<int>(i), counts[i], now, level});
    queued_tokens_ += tokens;
    return absl::OkStatus();
  }

  // Makes room for `texts` texts and `tokens` tokens of level `level` by taking out whole requests of
  // lower levels, the lowest level first and the newest first; false (nothing taken out) when even
  // all of them would not make room. The requests taken out go to `shed`, to be failed once the lock
  // is released.
  bool ShedLocked(uint8_t level, size_t texts, int64_t tokens, Shed<Request>& shed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t free_texts = options_.max_queued_texts - static_cast<int64_t>(queue_.size());
    int64_t free_tokens = options_.max_queued_tokens - queued_tokens_;
    std::vector<const BatchRequest*> marked;
    const auto enough = [&] { return free_texts >= static_cast<int64_t>(texts) && free_tokens >= tokens; };
    bool found = false;
    for (int lower = kPriorityLevels; lower > level && !found; --lower) {
      for (size_t i = queue_.size(); i-- > 0;) {
        const QueuedText<Request>& t = queue_[i];
        if (t.level != lower) continue;
        ++free_texts;
        free_tokens += t.tokens;
        if (marked.empty() || marked.back() != t.request.get()) marked.push_back(t.request.get());
        // A request's texts sit together (see DropDeadLocked): at its first text the request is whole.
        if ((i == 0 || queue_[i - 1].request != t.request) && enough()) {
          found = true;
          break;
        }
      }
    }
    if (!found) return false;
    std::sort(marked.begin(), marked.end());
    size_t kept = 0;
    for (size_t i = 0; i < queue_.size(); ++i) {
      QueuedText<Request>& t = queue_[i];
      if (std::binary_search(marked.begin(), marked.end(), t.request.get())) {
        if (shed.requests.empty() || shed.requests.back() != t.request) shed.requests.push_back(t.request);
        ++shed.texts[t.level];
        queued_tokens_ -= t.tokens;
        continue;
      }
      if (kept != i) queue_[kept] = std::move(t);
      ++kept;
    }
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(kept), queue_.end());
    return true;
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
    arrivals_.clear();
    levels_.clear();
    bool mixed = false;
    for (const QueuedText<Request>& t : queue_) {
      tokens_.push_back(t.tokens);
      mixed = mixed || t.level != queue_.front().level;
    }
    if (mixed) {  // with one level in use the seed is the oldest text, and levels change no order
      for (const QueuedText<Request>& t : queue_) {
        arrivals_.push_back(t.arrival);
        levels_.push_back(t.level);
      }
    }
    const size_t seed = mixed ? ChooseSeed(arrivals_, levels_, options_.priority_aging) : 0;
    bool full = false;
    ChooseBatch(tokens_, levels_, seed, options_, order_, chosen_, full);
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
  std::vector<absl::Time> arrivals_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t> levels_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> order_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> chosen_ ABSL_GUARDED_BY(mu_);
  std::vector<char> take_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SCHED_BATCH_SCHEDULER_H_

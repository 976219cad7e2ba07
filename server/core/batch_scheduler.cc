#include "server/core/batch_scheduler.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace qvi {

BatchRequest::BatchRequest(std::vector<int> token_counts, absl::Time deadline, std::function<bool()> is_cancelled,
                           std::function<void(absl::Status)> on_done)
    : token_counts_(std::move(token_counts)),
      deadline_(deadline),
      is_cancelled_(std::move(is_cancelled)),
      on_done_(std::move(on_done)),
      remaining_(token_counts_.size()) {}

void BatchRequest::Complete(int /*index*/, const absl::Status& status) {
  std::function<void(absl::Status)> done;
  absl::Status result = status;
  {
    MutexLock lock(&mu_);
    if (finished_) return;
    if (status.ok() && --remaining_ > 0) return;
    finished_ = true;
    done = std::move(on_done_);
  }
  // Outside the lock: the callback may do anything. It is its job to answer its caller; if it
  // throws, the exception stops here, so it cannot end the instance thread (or the process).
  try {
    done(result);
  } catch (...) {
    spdlog::error("a request's done-callback threw ({}); the request may be left unanswered", CurrentExceptionText());
  }
}

std::string CurrentExceptionText() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

void BatchRequest::Fail(const absl::Status& status) {
  Complete(-1, status.ok() ? absl::InternalError("failed") : status);
}

bool BatchRequest::IsCancelled() const {
  // Under the lock, so that Complete cannot finish the request (and the caller free what
  // is_cancelled_ reads) between the check of finished_ and the call.
  MutexLock lock(&mu_);
  return !finished_ && is_cancelled_ && is_cancelled_();
}

bool BatchRequest::finished() const {
  MutexLock lock(&mu_);
  return finished_;
}

absl::StatusOr<std::unique_ptr<BatchScheduler>> BatchScheduler::Create(const Options& o, const Clock* clock) {
  if (o.max_batch_size < 1)
    return absl::InvalidArgumentError(absl::StrCat("max_batch_size must be >= 1, got ", o.max_batch_size));
  if (o.max_batch_tokens < 1)
    return absl::InvalidArgumentError(absl::StrCat("max_batch_tokens must be >= 1, got ", o.max_batch_tokens));
  if (o.max_queue_delay < absl::ZeroDuration())
    return absl::InvalidArgumentError("max_queue_delay must not be negative");
  if (o.max_queued_texts < 1)
    return absl::InvalidArgumentError(absl::StrCat("max_queued_texts must be >= 1, got ", o.max_queued_texts));
  if (o.max_queued_tokens < 1)
    return absl::InvalidArgumentError(absl::StrCat("max_queued_tokens must be >= 1, got ", o.max_queued_tokens));
  return std::unique_ptr<BatchScheduler>(new BatchScheduler(o, clock));
}

absl::Status BatchScheduler::Enqueue(std::shared_ptr<BatchRequest> request) {
  const std::vector<int>& counts = request->token_counts();
  int64_t tokens = 0;
  for (int c : counts) tokens += c;
  MutexLock lock(&mu_);
  if (queue_.size() + counts.size() > static_cast<size_t>(options_.max_queued_texts) ||
      queued_tokens_ + tokens > options_.max_queued_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat("the model's queue is full (", queue_.size(), " texts, ",
                                                     queued_tokens_, " tokens waiting); retry with backoff"));
  }
  const absl::Time now = clock_->Now();
  for (size_t i = 0; i < counts.size(); ++i) queue_.push_back({request, static_cast<int>(i), counts[i], now});
  queued_tokens_ += tokens;
  return absl::OkStatus();
}

void BatchScheduler::DropDeadLocked(absl::Time now, std::vector<DeadRequest>& dead) {
  std::vector<QueuedText> alive;
  alive.reserve(queue_.size());
  for (QueuedText& t : queue_) {
    BatchRequest* r = t.request.get();
    bool drop = r->finished();
    if (!drop) {
      for (const DeadRequest& d : dead) drop = drop || d.first.get() == r;
    }
    if (!drop && r->IsCancelled()) {
      dead.emplace_back(t.request,
                        absl::CancelledError("the client cancelled the request before it reached the model"));
      drop = true;
    } else if (!drop && now > r->deadline()) {
      dead.emplace_back(t.request,
                        absl::DeadlineExceededError("the deadline passed while the request waited for the model"));
      drop = true;
    }
    if (drop) {
      queued_tokens_ -= t.tokens;
    } else {
      alive.push_back(std::move(t));
    }
  }
  queue_ = std::move(alive);
}

std::vector<size_t> BatchScheduler::FormLocked(bool& full) const {
  full = false;
  const int seed_len = queue_.front().tokens;
  std::vector<size_t> order(queue_.size() - 1);
  for (size_t i = 1; i < queue_.size(); ++i) order[i - 1] = i;
  // Closest in length to the seed first; among equals, the one that came first. (The lambda reads
  // the queue through a pointer: clang's lock analysis does not see that the sort runs under mu_.)
  const std::vector<QueuedText>* q = &queue_;
  std::stable_sort(order.begin(), order.end(), [q, seed_len](size_t a, size_t b) {
    return std::abs((*q)[a].tokens - seed_len) < std::abs((*q)[b].tokens - seed_len);
  });
  std::vector<size_t> batch{0};
  int longest = std::max(seed_len, 1);
  for (size_t i : order) {
    if (static_cast<int>(batch.size()) >= options_.max_batch_size) break;
    const int len = std::max(longest, queue_[i].tokens);
    if (static_cast<int64_t>(batch.size() + 1) * len > options_.max_batch_tokens) {
      full = true;
      break;
    }
    longest = len;
    batch.push_back(i);
  }
  if (static_cast<int>(batch.size()) >= options_.max_batch_size) full = true;
  if (static_cast<int64_t>(batch.size()) * longest >= options_.max_batch_tokens) full = true;
  return batch;
}

std::vector<QueuedText> BatchScheduler::TakeBatch(bool drain) {
  std::vector<DeadRequest> dead;
  std::vector<QueuedText> batch = FormBatchAndCollectDead(drain, dead);
  for (auto& [request, status] : dead) request->Fail(status);  // outside the lock
  return batch;
}

std::vector<QueuedText> BatchScheduler::FormBatchAndCollectDead(bool drain, std::vector<DeadRequest>& dead) {
  MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  DropDeadLocked(now, dead);
  if (queue_.empty()) return {};
  bool full = false;
  std::vector<size_t> chosen = FormLocked(full);
  if (!full && !drain && now < queue_.front().arrival + options_.max_queue_delay) return {};
  std::vector<QueuedText> batch;
  batch.reserve(chosen.size());
  std::vector<bool> take(queue_.size(), false);
  for (size_t i : chosen) take[i] = true;
  std::vector<QueuedText> rest;
  rest.reserve(queue_.size() - chosen.size());
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (take[i]) {
      queued_tokens_ -= queue_[i].tokens;
      batch.push_back(std::move(queue_[i]));
    } else {
      rest.push_back(std::move(queue_[i]));
    }
  }
  queue_ = std::move(rest);
  return batch;
}

absl::Time BatchScheduler::NextDue() const {
  MutexLock lock(&mu_);
  return queue_.empty() ? absl::InfiniteFuture() : queue_.front().arrival + options_.max_queue_delay;
}

size_t BatchScheduler::queued_texts() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

}  // namespace qvi

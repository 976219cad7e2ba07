#include "server/core/sched/batch_scheduler.h"
#include "server/core/base/exception_text.h"

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

absl::Status CheckBatchSchedulerOptions(const BatchSchedulerOptions& o) {
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
  if (o.priority_aging < absl::ZeroDuration()) return absl::InvalidArgumentError("priority_aging must not be negative");
  return absl::OkStatus();
}

absl::Status BatchQueueFull(size_t queued_texts, int64_t queued_tokens) {
  return absl::ResourceExhaustedError(absl::StrCat("the model's queue is full (", queued_texts, " texts, ",
                                                   queued_tokens, " tokens waiting); retry with backoff"));
}

absl::Status BatchCancelledWhileQueued() {
  return absl::CancelledError("the client cancelled the request before it reached the model");
}

absl::Status BatchExpiredWhileQueued() {
  return absl::DeadlineExceededError("the deadline passed while the request waited for the model");
}

absl::Status BatchShed(int level) {
  return absl::ResourceExhaustedError(
      absl::StrCat("the model's queue was full and a request of a higher priority took this one's place (priority ",
                   level, ", ", PriorityName(static_cast<Priority>(level)), "); retry with backoff"));
}

void ChooseBatch(const std::vector<int>& tokens, const std::vector<uint8_t>& levels, size_t seed,
                 const BatchSchedulerOptions& options, std::vector<size_t>& order, std::vector<size_t>& batch,
                 bool& full) {
  full = false;
  const int seed_len = tokens[seed];
  order.clear();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i != seed) order.push_back(i);
  }
  // The higher level first; within a level, the closest in length to the seed; among equals, the one
  // that came first. Only the first max_batch_size - 1 of that order can join the batch, so only
  // they are put in order.
  const auto closer = [&tokens, &levels, seed_len](size_t a, size_t b) {
    if (!levels.empty() && levels[a] != levels[b]) return levels[a] < levels[b];
    const int da = std::abs(tokens[a] - seed_len), db = std::abs(tokens[b] - seed_len);
    return da != db ? da < db : a < b;
  };
  const size_t wanted = std::min(order.size(), static_cast<size_t>(std::max(options.max_batch_size - 1, 0)));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(wanted), order.end(), closer);
  batch.clear();
  batch.push_back(seed);
  int longest = std::max(seed_len, 1);
  for (size_t k = 0; k < wanted; ++k) {
    const size_t i = order[k];
    const int len = std::max(longest, tokens[i]);
    if (static_cast<int64_t>(batch.size() + 1) * len > options.max_batch_tokens) {
      full = true;
      break;
    }
    longest = len;
    batch.push_back(i);
  }
  if (static_cast<int>(batch.size()) >= options.max_batch_size) full = true;
  if (static_cast<int64_t>(batch.size()) * longest >= options.max_batch_tokens) full = true;
}

size_t ChooseSeed(const std::vector<absl::Time>& arrivals, const std::vector<uint8_t>& levels, absl::Duration aging) {
  size_t seed = 0;
  absl::Time best = absl::InfiniteFuture();
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const absl::Time due = levels.empty() ? arrivals[i] : arrivals[i] + (levels[i] - 1) * aging;
    if (due < best) {
      best = due;
      seed = i;
    }
  }
  return seed;
}

bool BatchWouldBeFull(size_t texts, int longest, const BatchSchedulerOptions& options) {
  // ChooseBatch closes a batch by a limit exactly when the queue holds max_batch_size texts (it
  // stops at that many, or earlier at the token limit), or when all of them padded to the longest
  // reach max_batch_tokens (it takes them all and reaches it, or stops earlier at it).
  return texts >= static_cast<size_t>(options.max_batch_size) ||
         static_cast<int64_t>(texts) * std::max(longest, 1) >= options.max_batch_tokens;
}

}  // namespace qvi

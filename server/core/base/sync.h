// Mutex, scoped lock, condition variable and one-shot notification for the serving core, on the
// standard library's primitives and with Abseil's thread-safety annotations.
//
// Why not absl::Mutex: ThreadSanitizer must see every acquire and release. Debian's abseil is not
// built with -fsanitize=thread, so under TSan the ordering absl::Mutex provides is invisible and
// every guarded access is reported as a race. std::mutex goes through pthreads, which TSan
// intercepts, so the TSan build (scripts/sanitize.sh) checks the real locking.
#ifndef QVI_SERVER_CORE_BASE_SYNC_H_
#define QVI_SERVER_CORE_BASE_SYNC_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace qvi {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Waits may wake spuriously: callers re-check their condition in a loop.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // the caller's MutexLock still owns it
  }
  // Waits at most `timeout` (an infinite or very long timeout waits in one-hour steps).
  void WaitWithTimeout(Mutex* mu, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    timeout = std::min(std::max(timeout, absl::ZeroDuration()), absl::Hours(1));
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout));
    lock.release();
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

class Notification {
 public:
  void Notify() {
    MutexLock lock(&mu_);
    notified_ = true;
    cv_.SignalAll();
  }
  bool HasBeenNotified() {
    MutexLock lock(&mu_);
    return notified_;
  }
  void WaitForNotification() {
    MutexLock lock(&mu_);
    while (!notified_) cv_.Wait(&mu_);
  }
  // True when notified within `timeout` (measured on the monotonic clock).
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    timeout = std::min(timeout, absl::Hours(24 * 365));  // an infinite timeout must not overflow the sum
    const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    MutexLock lock(&mu_);
    for (auto now = std::chrono::steady_clock::now(); !notified_ && now < until; now = std::chrono::steady_clock::now())
      cv_.WaitWithTimeout(&mu_, absl::FromChrono(until - now));
    return notified_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_BASE_SYNC_H_

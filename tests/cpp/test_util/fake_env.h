// An environment whose clock moves only when a test advances it. Waits end when Advance() takes
// the clock past their time (or when their condition variable is signalled), so a runner's queue
// delay or a repository's poll interval passes exactly when the test says, without sleeping.
// Threads are real (and named).
#ifndef QVI_TESTS_CPP_TEST_UTIL_FAKE_ENV_H_
#define QVI_TESTS_CPP_TEST_UTIL_FAKE_ENV_H_

#include <set>
#include <utility>
#include <vector>

#include "server/core/base/env.h"
#include "server/core/base/sync.h"

namespace qvi {

class FakeEnv final : public Env {
 public:
  absl::Time Now() const override {
    MutexLock lock(&mu_);
    return now_;
  }

  // Moves the clock and wakes every wait, which then looks at the clock again. Must not run while
  // a waiting object is being destroyed (tests advance and destroy from the same thread).
  void Advance(absl::Duration d) {
    std::vector<Waiter> waiters;
    {
      MutexLock lock(&mu_);
      now_ += d;
      waiters.assign(waiters_.begin(), waiters_.end());
    }
    // The waiter holds its mutex from its look at the clock until CondVar::Wait releases it, so
    // taking that mutex here means the signal cannot fall between the two.
    for (const auto& [cv, waiter_mu] : waiters) {
      MutexLock lock(waiter_mu);
      cv->SignalAll();
    }
  }

  void WaitUntil(CondVar* cv, Mutex* mu, absl::Time until) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::multiset<Waiter>::iterator registered;
    {
      MutexLock lock(&mu_);
      if (now_ >= until) return;
      registered = waiters_.insert({cv, mu});
    }
    cv->Wait(mu);
    MutexLock lock(&mu_);
    waiters_.erase(registered);  // this wait's entry only: instance threads share a CondVar
  }

 private:
  using Waiter = std::pair<CondVar*, Mutex*>;
  mutable Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'700'000'000);
  mutable std::multiset<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qvi

#endif  // QVI_TESTS_CPP_TEST_UTIL_FAKE_ENV_H_

#include "server/core/base/env.h"

#include <pthread.h>

#include <chrono>

#include "absl/time/clock.h"

namespace qvi {

namespace {

class RealEnv final : public Env {
 public:
  absl::Time Now() const override {
    return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
  }
  void WaitUntil(CondVar* cv, Mutex* mu, absl::Time until) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (until == absl::InfiniteFuture()) {
      cv->Wait(mu);
    } else {
      cv->WaitWithTimeout(mu, until - Now());
    }
  }
};

}  // namespace

std::thread Env::StartThread(const std::string& name, std::function<void()> fn) const {
  return std::thread([name = name.substr(0, 15), fn = std::move(fn)] {
    pthread_setname_np(pthread_self(), name.c_str());
    fn();
  });
}

const Env* Env::Default() {
  static const RealEnv* env = new RealEnv();
  return env;
}

absl::Time MonotonicDeadline(const Env& env, absl::Time wall_deadline) {
  if (wall_deadline == absl::InfiniteFuture()) return wall_deadline;
  return env.Now() + (wall_deadline - absl::Now());
}

}  // namespace qvi

// The serving core's environment: time, waiting and threads, injected so that tests run the core
// on fake time (TF's Env, Envoy's TimeSource and thread factory).
//
//   Now()         monotonic time (steady_clock): queue delays, compute times, load timeouts, poll
//                 intervals and request deadlines. It never jumps with the wall clock; its epoch is
//                 arbitrary, so it is never shown. Wall time (absl::Now) is for logs only.
//   WaitUntil()   a condition-variable wait that ends by Now() reaching a time, so a fake clock that
//                 is advanced wakes it.
//   StartThread() a named thread (the name shows in top -H, perf and gdb).
//
// A deadline that arrives as wall time (gRPC's) is turned into monotonic time once, as the call
// arrives: MonotonicDeadline().
#ifndef QVI_SERVER_CORE_BASE_ENV_H_
#define QVI_SERVER_CORE_BASE_ENV_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "server/core/base/sync.h"

namespace qvi {

class Env {
 public:
  virtual ~Env() = default;

  virtual absl::Time Now() const = 0;

  // Waits on `cv`, as CondVar::Wait does (with `mu` held), until it is signalled or Now() reaches
  // `until` (InfiniteFuture: only a signal). May return early: callers re-check their condition.
  virtual void WaitUntil(CondVar* cv, Mutex* mu, absl::Time until) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // A thread named `name` (at most 15 characters are kept) running `fn`.
  virtual std::thread StartThread(const std::string& name, std::function<void()> fn) const;

  // The real environment: steady_clock and real waits. Lives as long as the process.
  static const Env* Default();
};

// A wall-clock deadline (gRPC's) as a time of `env`'s clock; InfiniteFuture stays infinite.
absl::Time MonotonicDeadline(const Env& env, absl::Time wall_deadline);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_BASE_ENV_H_

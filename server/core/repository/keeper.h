// The thread that keeps the repository's timed duties (the budget's idle unloads, the deadlines of the
// requests waiting for a load): it runs `pass`, which does what is due and returns when something next
// falls due, then sleeps until then, or until Poke() says something new may fall due sooner.
#ifndef QVI_SERVER_CORE_REPOSITORY_KEEPER_H_
#define QVI_SERVER_CORE_REPOSITORY_KEEPER_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "server/core/base/env.h"
#include "server/core/base/sync.h"

namespace qvi {

class Keeper {
 public:
  // Starts the thread (named qvi-keeper); its first pass runs at once.
  Keeper(const Env* env, std::function<absl::Time()> pass);
  ~Keeper();  // Stop()
  Keeper(const Keeper&) = delete;
  Keeper& operator=(const Keeper&) = delete;

  // Passes again soon, whatever the last pass said. Callable under the caller's own locks.
  void Poke() ABSL_LOCKS_EXCLUDED(mu_);
  // Returns once the thread has ended: no pass runs after it. More than once is fine.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const Env* env_;
  const std::function<absl::Time()> pass_;
  Mutex mu_;
  CondVar wake_;
  uint64_t pokes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_KEEPER_H_

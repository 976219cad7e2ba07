// A fixed pool of worker threads with a bounded queue. TrySubmit() never blocks: when the queue
// holds `max_queued` tasks it refuses at once, which the caller answers with RESOURCE_EXHAUSTED.
// Submit() never refuses: for work that must run (a request's answer), whose amount its caller
// bounds; after Shutdown() it runs the task on the caller's thread. Shutdown() stops taking work
// and returns after every accepted task has run.
//
// The server has two: request threads (qvi-request) check and tokenise requests, then hand their
// texts to the model's batch queue (ModelRunner), whose own threads run the model; answer threads
// (qvi-answer) turn a batch's outputs into each text's answer and complete the requests.
#ifndef QVI_SERVER_CORE_SCHED_EXECUTOR_H_
#define QVI_SERVER_CORE_SCHED_EXECUTOR_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "server/core/base/env.h"
#include "server/core/base/sync.h"

namespace qvi {

class Executor {
 public:
  // Its threads are named `name` (top -H, perf).
  Executor(int threads, int max_queued, const Env* env = Env::Default(), const std::string& name = "qvi-request");
  ~Executor();

  bool TrySubmit(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  void Submit(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Work() ABSL_LOCKS_EXCLUDED(mu_);

  const size_t max_queued_;
  Mutex mu_;
  CondVar changed_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SCHED_EXECUTOR_H_

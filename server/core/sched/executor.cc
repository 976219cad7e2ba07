#include "server/core/sched/executor.h"
#include "server/core/base/exception_text.h"

#include "spdlog/spdlog.h"

namespace qvi {

Executor::Executor(int threads, int max_queued, const Env* env, const std::string& name)
    : max_queued_(static_cast<size_t>(max_queued)) {
  for (int i = 0; i < threads; ++i) threads_.push_back(env->StartThread(name, [this] { Work(); }));
}

Executor::~Executor() { Shutdown(); }

bool Executor::TrySubmit(std::function<void()> task) {
  MutexLock lock(&mu_);
  if (stopping_ || queue_.size() >= max_queued_) return false;
  queue_.push_back(std::move(task));
  changed_.Signal();
  return true;
}

void Executor::Submit(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    if (!stopping_ && !threads_.empty()) {
      queue_.push_back(std::move(task));
      changed_.Signal();
      return;
    }
  }
  // Stopped (or no threads): the caller runs it, as a worker would have, exceptions contained.
  try {
    task();
  } catch (...) {
    spdlog::error("an executor task threw: {}", CurrentExceptionText());
  }
}

void Executor::Shutdown() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void Executor::Work() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) changed_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      task();
    } catch (...) {  // a task must answer its own caller; its exception must not end the thread
      spdlog::error("an executor task threw: {}", CurrentExceptionText());
    }
  }
}

}  // namespace qvi

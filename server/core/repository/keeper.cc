#include "server/core/repository/keeper.h"

#include <utility>

namespace qvi {

Keeper::Keeper(const Env* env, std::function<absl::Time()> pass) : env_(env), pass_(std::move(pass)) {
  thread_ = env_->StartThread("qvi-keeper", [this] { Loop(); });
}

Keeper::~Keeper() { Stop(); }

void Keeper::Poke() {
  MutexLock lock(&mu_);
  ++pokes_;
  wake_.SignalAll();
}

void Keeper::Stop() {
  {
    MutexLock lock(&mu_);
    stopped_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void Keeper::Loop() {
  while (true) {
    uint64_t seen = 0;
    {
      MutexLock lock(&mu_);
      if (stopped_) return;
      seen = pokes_;
    }
    const absl::Time next = pass_();
    MutexLock lock(&mu_);
    // A poke after the pass began may concern something that pass did not see.
    while (!stopped_ && pokes_ == seen && env_->Now() < next) env_->WaitUntil(&wake_, &mu_, next);
    if (stopped_) return;
  }
}

}  // namespace qvi

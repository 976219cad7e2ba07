// Guarantee 9 of model_repository.h, the requests' side: loads on demand and the requests waiting
// for them, and models unloaded when idle (the keeper thread).
#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "server/core/request/request_checks.h"
#include "server/core/serving/model_repository.h"

namespace qvi {
namespace {

constexpr char kWaitsForLoad[] = "type.qvi.dev/waits-for-load";
constexpr char kLoadDeadline[] = "the deadline passed while the model was loading on demand";

}  // namespace

ServableHandle Serving(const absl::StatusOr<ServableHandle>& loaded, const std::string& model, int64_t version) {
  if (!loaded.ok() || *loaded == nullptr || (*loaded)->name != model) return nullptr;
  return version == 0 || (*loaded)->version == version ? *loaded : nullptr;
}

bool WaitsForLoad(const absl::Status& status) { return status.GetPayload(kWaitsForLoad).has_value(); }

absl::Status ModelRepository::LoadsOnDemand(const std::string& name) {
  absl::Status status = absl::UnavailableError(
      absl::StrCat("model '", Capped(name), "' is not loaded; it loads on demand (--load-on-demand)"));
  status.SetPayload(kWaitsForLoad, absl::Cord(name));
  return status;
}

void ModelRepository::WhenLoaded(const std::string& name, absl::Time deadline, LoadedDone ready) {
  uint64_t start = 0;
  absl::Status refused = absl::UnavailableError(absl::StrCat("model '", Capped(name), "' is not loaded"));
  {
    MutexLock lock(&mu_);
    auto waiting = waiters_.find(name);
    if (stopped_ || !options_.load_on_demand) {
      // refused as not loaded
    } else if (waiting == waiters_.end() && static_cast<int>(waiters_.size()) >= options_.max_waiting_loads) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("model '", Capped(name), "' is not loaded, and ", waiters_.size(),
                       " other models are loading on demand already, the most at once (--max-waiting-loads ",
                       options_.max_waiting_loads, "); retry with backoff"));
    } else {
      if (waiting == waiters_.end()) {
        start = next_load_++;
        waiting = waiters_.emplace(name, Waiting{start, {}}).first;
      }
      waiting->second.waiters.push_back(Waiter{deadline, std::move(ready)});
      ++keeper_pokes_;
      keeper_wake_.SignalAll();
      room_freed_.SignalAll();  // a load waiting for room may now wait until this deadline
      ready = nullptr;
    }
  }
  if (ready) return ready(refused);
  if (start != 0) StartDemandLoad(name, start);
}

void ModelRepository::StartDemandLoad(const std::string& name, uint64_t load) {
  Control(name, true, LoadCause::kDemand, [this, name, load](const absl::Status& s) { Answer(name, load, s); });
}

void ModelRepository::HandOverLocked(const std::string& name, const ServableHandle& servable,
                                     std::vector<std::pair<Waiter, ServableHandle>>* answered) {
  auto it = waiters_.find(name);
  if (it == waiters_.end()) return;
  for (Waiter& w : it->second.waiters) answered->emplace_back(std::move(w), Used(servable));
  waiters_.erase(it);
  room_freed_.SignalAll();  // one load on demand fewer (max_waiting_loads)
}

void ModelRepository::Answer(const std::string& name, uint64_t load, const absl::Status& result) {
  std::vector<std::pair<Waiter, ServableHandle>> answered;
  std::vector<Waiter> failed;
  bool again = false;
  {
    MutexLock lock(&mu_);
    auto it = waiters_.find(name);
    if (it == waiters_.end() || it->second.load != load) return;  // answered at READY, or not this load's
    ServableHandle newest;
    if (auto entry = models_.find(name); entry != models_.end() && result.ok() && resting_.count(name) == 0) {
      for (const auto& [_, r] : entry->second.versions) {
        if (r.status.state == ModelState::kReady) newest = r.servable;  // the versions ascend
      }
    }
    const absl::Time now = env_->Now();
    const bool live = std::any_of(it->second.waiters.begin(), it->second.waiters.end(),
                                  [now](const Waiter& w) { return w.deadline > now; });
    if (newest != nullptr) {
      HandOverLocked(name, newest, &answered);
    } else if (!stopped_ && (result.ok() || (live && result.GetPayload(kGaveUp).has_value()))) {
      // Unloaded again before they held it, or the load gave up just before they came: another load.
      again = true;
    } else {
      failed = std::move(it->second.waiters);
      waiters_.erase(it);
      room_freed_.SignalAll();
    }
  }
  for (auto& [w, servable] : answered) w.ready(std::move(servable));
  const absl::Time now = env_->Now();
  for (Waiter& w : failed) {
    // One whose deadline passed hears that, whether the keeper or the failed load came first.
    if (w.deadline <= now) {
      w.ready(absl::DeadlineExceededError(kLoadDeadline));
    } else {
      w.ready(result.ok() ? absl::UnavailableError("the server is shutting down") : result);
    }
  }
  if (again) StartDemandLoad(name, load);
}

void ModelRepository::ExpireWaitersLocked(absl::Time now, absl::Time* next, std::vector<Waiter>* expired) {
  for (auto entry = waiters_.begin(); entry != waiters_.end();) {
    // Expired waiters leave; the load goes on for those left, and for the next request.
    std::vector<Waiter>& waiting = entry->second.waiters;
    for (auto w = waiting.begin(); w != waiting.end();) {
      if (w->deadline > now) {
        *next = std::min(*next, w->deadline);
        ++w;
        continue;
      }
      expired->push_back(std::move(*w));
      w = waiting.erase(w);
      room_freed_.SignalAll();  // the load may wait less now
    }
    // Nobody waits: the load gives up if it still waits for room, and the next request starts another.
    entry = waiting.empty() ? waiters_.erase(entry) : std::next(entry);
  }
}

std::vector<std::string> ModelRepository::IdleModelsLocked(absl::Time now, absl::Time* next) const {
  std::vector<std::string> idle;
  const absl::Duration after = options_.unload_idle_after;
  if (after <= absl::ZeroDuration()) return idle;
  *next = std::min(*next, now + after);  // for versions READY from now on
  for (const auto& [name, entry] : models_) {
    if (busy_.count(name) > 0) continue;
    absl::Time last = absl::InfinitePast();
    bool ready = false, in_use = false;
    for (const auto& [_, r] : entry.versions) {
      if (r.status.state != ModelState::kReady || r.servable == nullptr) continue;
      ready = true;
      in_use = in_use || r.servable.use_count() > 1;
      last = std::max({last, r.loaded, absl::FromUnixNanos(r.servable->last_used_ns.load(std::memory_order_relaxed))});
    }
    if (ready && !in_use && last + after <= now) {
      idle.push_back(name);
    } else if (ready) {
      *next = std::min(*next, in_use ? now + after : last + after);
    }
  }
  return idle;
}

absl::Time ModelRepository::KeepOnce() {
  std::vector<Waiter> expired;
  std::vector<ServableHandle> release;
  std::vector<std::pair<std::string, VersionStatus>> unloading;
  std::vector<std::string> idle;
  absl::Time next = absl::InfiniteFuture();
  {
    MutexLock lock(&mu_);
    keeper_seen_ = keeper_pokes_;
    const absl::Time now = env_->Now();
    ExpireWaitersLocked(now, &next, &expired);
    idle = IdleModelsLocked(now, &next);
    for (const std::string& name : idle) {
      RestLocked(name,
                 absl::StrCat("unloaded after ", absl::FormatDuration(options_.unload_idle_after),
                              " without a request (--unload-idle-after)"),
                 &release, &unloading);
    }
  }
  for (Waiter& w : expired) {
    w.ready(absl::DeadlineExceededError(kLoadDeadline));
  }
  for (const auto& [n, s] : unloading) Notify(n, s);
  for (const std::string& name : idle) {
    if (options_.memory_event) options_.memory_event(name, false, "idle");
  }
  return next;
}

void ModelRepository::KeeperLoop() {
  while (true) {
    const absl::Time next = KeepOnce();
    MutexLock lock(&mu_);
    // A waiter that came after KeepOnce() looked (a poke) has a deadline it did not see.
    while (!stopped_ && keeper_pokes_ == keeper_seen_ && env_->Now() < next) {
      env_->WaitUntil(&keeper_wake_, &mu_, next);
    }
    if (stopped_) return;
  }
}

}  // namespace qvi

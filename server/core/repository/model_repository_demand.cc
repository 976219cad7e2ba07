// Guarantee 9 of model_repository.h, the requests' side: loads on demand and the requests waiting
// for them, and models unloaded when idle (the keeper thread).
#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request_checks.h"

namespace qvi {
namespace {

constexpr char kWaitsForLoad[] = "type.qvi.dev/waits-for-load";
constexpr char kLoadDeadline[] = "the deadline passed while the model was loading on demand";

}  // namespace

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
    if (stopped_ || !options_.load_on_demand) {
      // refused as not loaded
    } else if (!waiters_.Waiting(name) && static_cast<int>(waiters_.models()) >= options_.max_waiting_loads) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("model '", Capped(name), "' is not loaded, and ", waiters_.models(),
                       " other models are loading on demand already, the most at once (--max-waiting-loads ",
                       options_.max_waiting_loads, "); retry with backoff"));
    } else {
      start = waiters_.Add(name, Waiter{deadline, std::move(ready)});
      if (keeper_ != nullptr) keeper_->Poke();  // a deadline it has not seen
      room_freed_.SignalAll();                  // a load waiting for room may now wait until this deadline
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
  if (!waiters_.Waiting(name)) return;
  for (Waiter& w : waiters_.Take(name)) answered->emplace_back(std::move(w), Used(servable));
  room_freed_.SignalAll();  // one load on demand fewer (max_waiting_loads)
}

void ModelRepository::Answer(const std::string& name, uint64_t load, const absl::Status& result) {
  std::vector<std::pair<Waiter, ServableHandle>> answered;
  std::vector<Waiter> failed;
  bool again = false;
  {
    MutexLock lock(&mu_);
    if (waiters_.LoadOf(name) != load) return;  // answered at READY, or not this load's
    ServableHandle newest;
    if (auto entry = models_.find(name); entry != models_.end() && result.ok() && resting_.count(name) == 0) {
      for (const auto& [_, r] : entry->second.versions) {
        if (r.status.state == ModelState::kReady) newest = r.servable;  // the versions ascend
      }
    }
    const bool live = waiters_.AnyAfter(name, env_->Now());
    if (newest != nullptr) {
      HandOverLocked(name, newest, &answered);
    } else if (!stopped_ && (result.ok() || (live && result.GetPayload(kGaveUp).has_value()))) {
      // Unloaded again before they held it, or the load gave up just before they came: another load.
      again = true;
    } else {
      failed = waiters_.Take(name);
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

std::vector<std::string> ModelRepository::IdleModelsLocked(absl::Time now, absl::Time* next) const {
  const absl::Duration after = options_.unload_idle_after;
  if (after <= absl::ZeroDuration()) return {};
  std::vector<ModelUse> uses;
  for (const auto& [name, entry] : models_) {
    if (busy_.count(name) > 0) continue;
    ModelUse use{name, false, false, absl::InfinitePast()};
    for (const auto& [_, r] : entry.versions) {
      if (r.status.state != ModelState::kReady || r.servable == nullptr) continue;
      use.ready = true;
      use.in_use = use.in_use || r.servable.use_count() > 1;
      use.last =
          std::max({use.last, r.loaded, absl::FromUnixNanos(r.servable->last_used_ns.load(std::memory_order_relaxed))});
    }
    uses.push_back(std::move(use));
  }
  return IdleModels(uses, after, now, next);
}

absl::Time ModelRepository::KeepOnce() {
  std::vector<Waiter> expired;
  Leaving leaving;
  std::vector<std::string> idle;
  absl::Time next = absl::InfiniteFuture();
  {
    MutexLock lock(&mu_);
    const absl::Time now = env_->Now();
    // Expired waiters leave; the load goes on for those left, and for the next request.
    expired = waiters_.Expire(now, &next);
    if (!expired.empty()) room_freed_.SignalAll();  // the load may wait less now, or give up
    idle = IdleModelsLocked(now, &next);
    for (const std::string& name : idle) {
      RestLocked(name,
                 absl::StrCat("unloaded after ", absl::FormatDuration(options_.unload_idle_after),
                              " without a request (--unload-idle-after)"),
                 &leaving);
    }
  }
  for (Waiter& w : expired) {
    w.ready(absl::DeadlineExceededError(kLoadDeadline));
  }
  Announce(leaving);
  for (const std::string& name : idle) {
    if (options_.memory_event) options_.memory_event(name, false, "idle");
  }
  leaving.release.clear();  // after the events: the unloader reports each version gone after its unloading
  return next;
}

}  // namespace qvi

#include "server/core/repository/demand_loads.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/repository/memory_policy.h"
#include "server/core/request/request_checks.h"

namespace qvi {
namespace {

constexpr char kLoadDeadline[] = "the deadline passed while the model was loading on demand";

}  // namespace

void DemandLoads::Start() {
  if (s_.options.unload_idle_after > absl::ZeroDuration() || s_.options.load_on_demand) {
    keeper_ = std::make_unique<Keeper>(s_.env, [this] { return KeepOnce(); });
  }
}

void DemandLoads::Stop() {
  if (keeper_ != nullptr) keeper_->Stop();
}

void DemandLoads::WhenLoaded(const std::string& name, absl::Time deadline, LoadWaiters::Ready ready) {
  uint64_t start = 0;
  absl::Status refused = absl::UnavailableError(absl::StrCat("model '", Capped(name), "' is not loaded"));
  {
    MutexLock lock(&s_.mu);
    if (s_.stopped || !s_.options.load_on_demand) {
      // refused as not loaded
    } else if (!s_.waiters.Waiting(name) && static_cast<int>(s_.waiters.models()) >= s_.options.max_waiting_loads) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("model '", Capped(name), "' is not loaded, and ", s_.waiters.models(),
                       " other models are loading on demand already, the most at once (--max-waiting-loads ",
                       s_.options.max_waiting_loads, "); retry with backoff"));
    } else {
      start = s_.waiters.Add(name, Waiter{deadline, std::move(ready)});
      if (keeper_ != nullptr) keeper_->Poke();  // a deadline it has not seen
      s_.room_freed.SignalAll();                // a load waiting for room may now wait until this deadline
      ready = nullptr;
    }
  }
  if (ready) return ready(refused);
  if (start != 0) StartDemandLoad(name, start);
}

void DemandLoads::StartDemandLoad(const std::string& name, uint64_t load) {
  control_.Control(name, true, LoadCause::kDemand,
                   [this, name, load](const absl::Status& s) { Answer(name, load, s); });
}

void DemandLoads::Answer(const std::string& name, uint64_t load, const absl::Status& result) {
  std::vector<std::pair<Waiter, ServableHandle>> answered;
  std::vector<Waiter> failed;
  bool again = false;
  {
    MutexLock lock(&s_.mu);
    if (s_.waiters.LoadOf(name) != load) return;  // answered at READY, or not this load's
    ServableHandle newest;
    if (auto entry = s_.models.find(name); entry != s_.models.end() && result.ok() && s_.resting.count(name) == 0) {
      const int64_t shadow = entry->second.shadow ? entry->second.shadow->version : 0;
      for (const auto& [version, r] : entry->second.versions) {
        // the versions ascend; a shadow candidate serves no request that names no version
        if (r.status.state == ModelState::kReady && version != shadow) newest = r.servable;
      }
    }
    const bool live = s_.waiters.AnyAfter(name, s_.env->Now());
    if (newest != nullptr) {
      s_.HandOverLocked(name, newest, &answered);
    } else if (!s_.stopped && (result.ok() || (live && result.GetPayload(kGaveUp).has_value()))) {
      // Unloaded again before they held it, or the load gave up just before they came: another load.
      again = true;
    } else {
      failed = s_.waiters.Take(name);
      s_.room_freed.SignalAll();
    }
  }
  for (auto& [w, servable] : answered) w.ready(std::move(servable));
  const absl::Time now = s_.env->Now();
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

std::vector<std::string> DemandLoads::IdleModelsLocked(absl::Time now, absl::Time* next) const {
  const absl::Duration after = s_.options.unload_idle_after;
  if (after <= absl::ZeroDuration()) return {};
  std::vector<ModelUse> uses;
  for (const auto& [name, entry] : s_.models) {
    if (s_.busy.count(name) > 0) continue;
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

absl::Time DemandLoads::KeepOnce() {
  std::vector<Waiter> expired;
  Leaving leaving;
  std::vector<std::string> idle;
  absl::Time next = absl::InfiniteFuture();
  {
    MutexLock lock(&s_.mu);
    const absl::Time now = s_.env->Now();
    // Expired waiters leave; the load goes on for those left, and for the next request.
    expired = s_.waiters.Expire(now, &next);
    if (!expired.empty()) s_.room_freed.SignalAll();  // the load may wait less now, or give up
    idle = IdleModelsLocked(now, &next);
    for (const std::string& name : idle) {
      s_.RestLocked(name,
                    absl::StrCat("unloaded after ", absl::FormatDuration(s_.options.unload_idle_after),
                                 " without a request (--unload-idle-after)"),
                    &leaving);
    }
  }
  for (Waiter& w : expired) {
    w.ready(absl::DeadlineExceededError(kLoadDeadline));
  }
  s_.Announce(leaving);
  for (const std::string& name : idle) {
    if (s_.options.memory_event) s_.options.memory_event(name, false, "idle");
  }
  leaving.release.clear();  // after the events: the unloader reports each version gone after its unloading
  return next;
}

}  // namespace qvi

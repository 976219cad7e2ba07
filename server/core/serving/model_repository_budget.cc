// Guarantee 9 of model_repository.h: each version's footprint measured at load, the memory budget per
// device with its least-recently-used evictions, models unloaded when idle, and loads on demand.
#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/model/cuda_support.h"
#include "server/core/request/request_checks.h"
#include "server/core/serving/model_repository.h"

namespace qvi {
namespace {

namespace fs = std::filesystem;

constexpr char kWaitsForLoad[] = "type.qvi.dev/waits-for-load";

// Before a load: the largest model file of the version folder, a floor for its weights in memory.
int64_t LargestModelFile(const std::string& dir) {
  int64_t largest = 0;
  std::error_code ec;
  for (const std::string& name : ModelFileNames()) {
    const auto size = fs::file_size(fs::path(dir) / name, ec);
    if (!ec) largest = std::max(largest, static_cast<int64_t>(size));
  }
  return largest;
}

}  // namespace

const char* LoadCauseName(LoadCause cause) {
  switch (cause) {
    case LoadCause::kPoll:
      return "poll";
    case LoadCause::kAdmin:
      return "admin";
    case LoadCause::kDemand:
      return "demand";
  }
  return "unknown";
}

bool WaitsForLoad(const absl::Status& status) { return status.GetPayload(kWaitsForLoad).has_value(); }

absl::Status ModelRepository::LoadsOnDemand(const std::string& name) {
  absl::Status status = absl::UnavailableError(
      absl::StrCat("model '", Capped(name), "' is not loaded; it loads on demand (--load-on-demand)"));
  status.SetPayload(kWaitsForLoad, absl::Cord(name));
  return status;
}

int64_t ModelRepository::ChargedLocked(uint64_t generation) const {
  auto charge = charges_.find(generation);
  return charge == charges_.end() ? 0 : charge->second.bytes;
}

int64_t ModelRepository::UsedLocked(const std::string& device) const {
  int64_t used = 0;
  for (const auto& [_, charge] : charges_) used += charge.device == device ? charge.bytes : 0;
  return used;
}

std::vector<ModelRepository::IdleModel> ModelRepository::IdleOnLocked(const std::string& device,
                                                                      const std::string& except) const {
  std::vector<IdleModel> idle_models;
  for (const auto& [name, entry] : models_) {
    if (name == except || busy_.count(name) > 0) continue;  // a poll or load of it is under way
    bool idle = true;
    IdleModel m{name, 0, 0};
    for (const auto& [_, r] : entry.versions) {
      if (r.status.state == ModelState::kLoading) idle = false;
      if (r.status.state != ModelState::kReady || r.servable == nullptr) continue;
      // Under mu_ nobody can take a new hold: one hold (ours) means no request has it.
      idle = idle && r.servable.use_count() == 1;
      auto charge = charges_.find(r.generation);
      if (charge != charges_.end() && charge->second.device == device) m.bytes += charge->second.bytes;
      m.last_used_ns = std::max(m.last_used_ns, r.servable->last_used_ns.load(std::memory_order_relaxed));
    }
    if (idle && m.bytes > 0) idle_models.push_back(m);
  }
  std::sort(idle_models.begin(), idle_models.end(),
            [](const IdleModel& a, const IdleModel& b) { return a.last_used_ns < b.last_used_ns; });
  return idle_models;
}

void ModelRepository::RestLocked(const std::string& name, const std::string& reason,
                                 std::vector<ServableHandle>* release,
                                 std::vector<std::pair<std::string, VersionStatus>>* unloading) {
  resting_[name] = reason;
  auto entry = models_.find(name);
  if (entry == models_.end()) return;
  for (auto& [_, r] : entry->second.versions) {
    if (r.status.state != ModelState::kReady) continue;
    r.status.state = ModelState::kUnloading;
    r.status.reason = reason;
    release->push_back(std::move(r.servable));
    unloading->emplace_back(name, r.status);
  }
}

int64_t ModelRepository::LeavingLocked(const std::string& device) const {
  std::set<uint64_t> serving;
  for (const auto& [_, entry] : models_) {
    for (const auto& [v, r] : entry.versions) {
      if (r.status.state == ModelState::kReady) serving.insert(r.generation);
    }
  }
  int64_t leaving = 0;
  for (const auto& [generation, charge] : charges_) {
    if (charge.device == device && serving.count(generation) == 0) leaving += charge.bytes;
  }
  return leaving;
}

absl::Status ModelRepository::NoRoomLocked(const std::string& name, const std::string& device, int64_t budget,
                                           int64_t need, const char* why) const {
  std::vector<std::string> held;
  for (const auto& [n, entry] : models_) {
    int64_t bytes = 0;
    for (const auto& [v, r] : entry.versions) {
      auto charge = charges_.find(r.generation);
      if (charge != charges_.end() && charge->second.device == device) bytes += charge->second.bytes;
    }
    if (bytes > 0) held.push_back(absl::StrCat(n, " ", FormatBytes(bytes)));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("model '", Capped(name), "' needs about ", FormatBytes(need), " of ", device,
                   " and the memory budget (", FormatBytes(budget), ", --device-memory-budget) has ",
                   FormatBytes(std::max<int64_t>(budget - UsedLocked(device), 0)),
                   " left; loaded: ", held.empty() ? "(none)" : absl::StrJoin(held, ", "), held.empty() ? "" : why));
}

absl::Status ModelRepository::MakeRoom(const std::string& name, const std::string& device, int64_t budget, int64_t need,
                                       bool evict) {
  const absl::Time until = env_->Now() + options_.load_timeout;
  while (true) {  // one eviction a round, the least recently used first, until the load fits
    std::vector<ServableHandle> release;
    std::vector<std::pair<std::string, VersionStatus>> unloading;
    std::string evicted;
    {
      MutexLock lock(&mu_);
      if (stopped_) return absl::CancelledError("not loaded: the server is shutting down");
      const int64_t used = UsedLocked(device);
      if (used + need <= budget) return absl::OkStatus();
      // Versions already unloading free their memory once their requests are answered.
      const int64_t leaving = LeavingLocked(device);
      const bool timed_out = env_->Now() >= until;
      if (leaving > 0 && used - leaving + need <= budget && !timed_out) {
        env_->WaitUntil(&room_freed_, &mu_, until);
        continue;
      }
      if (timed_out)
        return NoRoomLocked(name, device, budget, need, "; the versions unloading did not free it in time");
      if (need > budget) return NoRoomLocked(name, device, budget, need, "; it needs more than the whole budget");
      if (!evict) return NoRoomLocked(name, device, budget, need, "; a poll of the store evicts no other model");
      // Nothing is unloaded unless unloading what is idle makes room.
      const std::vector<IdleModel> idle = IdleOnLocked(device, name);
      int64_t idle_bytes = 0;
      for (const IdleModel& m : idle) idle_bytes += m.bytes;
      if (idle.empty() || used - leaving - idle_bytes + need > budget) {
        return NoRoomLocked(name, device, budget, need,
                            idle.empty() ? "; none of them is idle" : "; unloading every idle one would not make room");
      }
      evicted = idle.front().name;
      RestLocked(evicted,
                 absl::StrCat("unloaded to make room for '", Capped(name), "' within the memory budget of ", device,
                              " (the least recently used idle model)"),
                 &release, &unloading);
    }
    for (const auto& [n, s] : unloading) Notify(n, s);
    if (options_.memory_event) options_.memory_event(evicted, false, "budget");
    release.clear();  // idle: they go to the unloader now, and their charges with them
  }
}

absl::StatusOr<ServableHandle> ModelRepository::MakeServableInBudget(const std::string& name, int64_t version,
                                                                     const StoreModel& found, uint64_t generation,
                                                                     LoadCause cause) {
  const bool budget = options_.memory_budget.enabled();
  // Without a budget, loads run side by side and each footprint is measured as well as that allows.
  std::optional<MutexLock> measuring;
  if (budget) measuring.emplace(&budget_mu_);
  absl::StatusOr<c10::Device> device = ResolveDevice(
      ResolvePlacement(options_.defaults, found.overrides.ok() ? *found.overrides : ServingOverrides{}).device);
  if (!device.ok()) return device.status();
  const std::string key = device->str();
  std::optional<int64_t> declared;
  if (found.overrides.ok()) declared = found.overrides->memory_bytes;
  const int64_t limit = budget ? options_.memory_budget.On(meter_->Capacity(*device)) : 0;
  const bool evict = cause != LoadCause::kPoll;
  if (budget) {
    const int64_t need = declared.value_or(LargestModelFile(source_.VersionDir(name, version)));
    if (absl::Status room = MakeRoom(name, key, limit, need, evict); !room.ok()) return room;
  }
  const int64_t before = meter_->InUse(*device);
  absl::StatusOr<ServableHandle> servable = MakeServable(name, version, found, generation);
  if (!servable.ok()) return servable;
  const int64_t bytes = declared.value_or(std::max<int64_t>(meter_->InUse(*device) - before, 0));
  if (budget) {
    // The file's size was a floor: when the version took more, room for the rest is made now. If
    // there is none, the version is let go (the unloader frees it).
    if (absl::Status room = MakeRoom(name, key, limit, bytes, evict); !room.ok()) return room;
  }
  MutexLock lock(&mu_);
  charges_[generation] = Charge{key, bytes};
  return servable;
}

void ModelRepository::WhenLoaded(const std::string& name, absl::Time deadline, ControlDone ready) {
  bool start = false;
  {
    MutexLock lock(&mu_);
    if (!stopped_ && options_.load_on_demand) {
      std::vector<Waiter>& waiting = waiters_[name];
      start = waiting.empty();
      waiting.push_back(Waiter{deadline, std::move(ready)});
      ++keeper_pokes_;
      keeper_wake_.SignalAll();
      ready = nullptr;
    }
  }
  if (ready) return ready(absl::UnavailableError(absl::StrCat("model '", Capped(name), "' is not loaded")));
  if (start) Control(name, true, LoadCause::kDemand, [this, name](const absl::Status& s) { Answer(name, s); });
}

void ModelRepository::Answer(const std::string& name, const absl::Status& result) {
  std::vector<Waiter> waiting;
  {
    MutexLock lock(&mu_);
    auto it = waiters_.find(name);
    if (it == waiters_.end()) return;
    waiting = std::move(it->second);
    waiters_.erase(it);
  }
  for (Waiter& w : waiting) w.ready(result);
}

void ModelRepository::ExpireWaitersLocked(absl::Time now, absl::Time* next, std::vector<Waiter>* expired) {
  for (auto& [name, waiting] : waiters_) {
    // Expired waiters leave; the load goes on for those left, and for the next request.
    for (auto w = waiting.begin(); w != waiting.end();) {
      if (w->deadline > now) {
        *next = std::min(*next, w->deadline);
        ++w;
        continue;
      }
      expired->push_back(std::move(*w));
      w = waiting.erase(w);
    }
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
    w.ready(absl::DeadlineExceededError("the deadline passed while the model was loading on demand"));
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

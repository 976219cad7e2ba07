#include "server/core/repository/repository_state.h"

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/model/model.h"
#include "server/core/request/request_checks.h"

namespace qvi {

// A load on demand that stopped waiting for room because nobody waited for it any more (budget_gate.cc).
const char kGaveUp[] = "type.qvi.dev/load-gave-up";

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

RepositoryState::RepositoryState(RepositoryOptions o)
    : options(std::move(o)),
      source(options.root, ModelFileNames()),
      env(options.env != nullptr ? options.env : Env::Default()),
      meter(options.meter != nullptr ? options.meter : &SystemMemoryMeter()) {}

void RepositoryState::Notify(const std::string& name, const VersionStatus& status) const {
  if (options.listener) options.listener(name, status);
}

void RepositoryState::Announce(const Leaving& leaving) const {
  for (const auto& [name, status] : leaving.unloading) Notify(name, status);
}

ServableHandle RepositoryState::Used(const ServableHandle& servable) const {
  servable->last_used_ns.store(absl::ToUnixNanos(env->Now()), std::memory_order_relaxed);
  return servable;
}

void RepositoryState::RestLocked(const std::string& name, const std::string& reason, Leaving* leaving) {
  resting[name] = reason;
  auto entry = models.find(name);
  if (entry == models.end()) return;
  for (auto& [_, r] : entry->second.versions) {
    if (r.status.state != ModelState::kReady) continue;
    r.status.state = ModelState::kUnloading;
    r.status.reason = reason;
    leaving->release.push_back(std::move(r.servable));
    leaving->unloading.emplace_back(name, r.status);
  }
}

std::optional<StoreModel> RepositoryState::FoundLocked(const std::string& name,
                                                       std::map<std::string, StoreModel>& disk) const {
  if (options.model_control == ModelControl::kExplicit && wanted.count(name) == 0) return std::nullopt;
  if (resting.count(name) > 0) return std::nullopt;  // unloaded to save memory: loaded again when asked
  auto it = disk.find(name);
  if (it == disk.end()) return std::nullopt;
  return std::move(it->second);
}

bool RepositoryState::UnloadedByAdminLocked(const std::string& name, const StoreModel* found) const {
  return found == nullptr && on_disk.count(name) > 0 && resting.count(name) == 0 &&
         options.model_control == ModelControl::kExplicit && wanted.count(name) == 0;
}

void RepositoryState::WakeLocked(const std::string& name) {
  // A resting model has no READY version; the budget's refusals (FAILED) are tried again now.
  if (resting.erase(name) == 0 || models.count(name) == 0) return;
  std::map<int64_t, Record>& versions = models[name].versions;
  for (auto v = versions.begin(); v != versions.end();) {
    v = v->second.status.state == ModelState::kFailed ? versions.erase(v) : std::next(v);
  }
  if (versions.empty()) models.erase(name);
}

void RepositoryState::HandOverLocked(const std::string& name, const ServableHandle& servable,
                                     std::vector<std::pair<LoadWaiters::Waiter, ServableHandle>>* answered) {
  if (!waiters.Waiting(name)) return;
  // A shadow candidate answers no request that names no version, which is what the waiters are handed
  // (Serving()): they wait on for the version that serves.
  if (const auto entry = models.find(name);
      entry != models.end() && entry->second.shadow && entry->second.shadow->version == servable->version) {
    return;
  }
  for (LoadWaiters::Waiter& w : waiters.Take(name)) answered->emplace_back(std::move(w), Used(servable));
  room_freed.SignalAll();  // one load on demand fewer (max_waiting_loads)
}

int64_t RepositoryState::ShadowLocked(const std::string& name, Entry& entry) {
  if (const auto o = shadow_overrides.find(name); o != shadow_overrides.end()) entry.shadow = o->second;
  return entry.shadow ? entry.shadow->version : 0;
}

absl::Status RepositoryState::SetShadow(const std::string& name, std::optional<ShadowSettings> shadow) {
  MutexLock lock(&mu);
  if (stopped) return absl::UnavailableError("the server is shutting down");
  const auto it = models.find(name);
  if (it == models.end()) return absl::NotFoundError(absl::StrCat("model '", Capped(name), "' is not served"));
  shadow_overrides[name] = shadow;
  it->second.shadow = shadow;  // requests that name no version see it at once; the next poll loads the candidate
  poll_soon = true;
  poll_wake.SignalAll();
  return absl::OkStatus();
}

}  // namespace qvi

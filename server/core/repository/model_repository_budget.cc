// Guarantee 9 of model_repository.h: each version's footprint measured at load, and the memory budget
// per device: loads in turn, each making room by least-recently-used evictions.
#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/model/cuda_support.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request_checks.h"

namespace qvi {
namespace {

namespace fs = std::filesystem;

}  // namespace

// A load on demand that stopped waiting for room because nobody waited for it any more (GaveUpLocked).
const char kGaveUp[] = "type.qvi.dev/load-gave-up";

namespace {

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

std::vector<Evictable> ModelRepository::EvictableOnLocked(const std::string& device, const std::string& except) const {
  std::vector<Evictable> found;
  for (const auto& [name, entry] : models_) {
    // A job of it running (not one merely queued: a poll tick queues one for every model, and the workers
    // may all be waiting for this load's turn to end).
    if (name == except || turns_.count(name) > 0) continue;
    Evictable m{name, 0, 0, false};
    bool loading = false;
    for (const auto& [_, r] : entry.versions) {
      loading = loading || r.status.state == ModelState::kLoading;
      if (r.status.state != ModelState::kReady || r.servable == nullptr) continue;
      // Under mu_ nobody can take a new hold: one hold (ours) means no request has it.
      m.busy = m.busy || r.servable.use_count() > 1;
      m.bytes += ledger_.On(r.generation, device);
      m.last_used_ns = std::max(m.last_used_ns, r.servable->last_used_ns.load(std::memory_order_relaxed));
    }
    if (!loading && m.bytes > 0) found.push_back(m);
  }
  return found;
}

void ModelRepository::RestLocked(const std::string& name, const std::string& reason, Leaving* leaving) {
  resting_[name] = reason;
  auto entry = models_.find(name);
  if (entry == models_.end()) return;
  for (auto& [_, r] : entry->second.versions) {
    if (r.status.state != ModelState::kReady) continue;
    r.status.state = ModelState::kUnloading;
    r.status.reason = reason;
    leaving->release.push_back(std::move(r.servable));
    leaving->unloading.emplace_back(name, r.status);
  }
}

int64_t ModelRepository::LeavingLocked(const std::string& device) const {
  std::set<uint64_t> serving;
  for (const auto& [_, entry] : models_) {
    for (const auto& [v, r] : entry.versions) {
      if (r.status.state == ModelState::kReady) serving.insert(r.generation);
    }
  }
  return ledger_.Leaving(device, serving);
}

absl::Status ModelRepository::NoRoomLocked(const std::string& name, const std::string& device, int64_t budget,
                                           int64_t need, const char* why) const {
  std::vector<std::string> held;
  for (const auto& [n, entry] : models_) {
    int64_t bytes = 0;
    for (const auto& [v, r] : entry.versions) {
      bytes += ledger_.On(r.generation, device);
    }
    if (bytes > 0) held.push_back(absl::StrCat(n, " ", FormatBytes(bytes)));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("model '", Capped(name), "' needs about ", FormatBytes(need), " of ", device,
                   " and the memory budget (", FormatBytes(budget), ", --device-memory-budget) has ",
                   FormatBytes(std::max<int64_t>(budget - ledger_.Used(device), 0)),
                   " left; loaded: ", held.empty() ? "(none)" : absl::StrJoin(held, ", "), held.empty() ? "" : why));
}

absl::Time ModelRepository::WaitUntilLocked(const std::string& name, LoadCause cause, absl::Time started) const {
  absl::Time until = started + options_.load_timeout;
  if (cause != LoadCause::kDemand) return until;
  // Nobody waits any more: give up now.
  return std::min(until, waiters_.Latest(name, env_->Now()));
}

absl::Status ModelRepository::GaveUpLocked(const std::string& name, const char* waiting_for) const {
  // RESOURCE_EXHAUSTED: the model rests, and the next request for it loads it again.
  absl::Status status = absl::ResourceExhaustedError(absl::StrCat(
      "model '", Capped(name), "' waited ", waiting_for, " until the deadline of every request for it had passed"));
  status.SetPayload(kGaveUp, absl::Cord(name));
  return status;
}

absl::Status ModelRepository::AwaitTurn(const std::string& name, LoadCause cause, absl::Time started) {
  MutexLock lock(&mu_);
  while (true) {
    if (stopped_) return absl::CancelledError("not loaded: the server is shutting down");
    auto mine = turns_.find(name);
    if (mine == turns_.end()) return absl::OkStatus();  // a load outside a poll worker's job: none in tests
    bool first = true;
    for (const auto& [_, turn] : turns_) first = first && turn >= mine->second;
    if (first) return absl::OkStatus();
    const absl::Time until = WaitUntilLocked(name, cause, started);
    if (env_->Now() >= until) {
      return cause == LoadCause::kDemand
                 ? GaveUpLocked(name, "for the loads before it")
                 : absl::ResourceExhaustedError(absl::StrCat("model '", Capped(name), "' waited ",
                                                             absl::FormatDuration(options_.load_timeout),
                                                             " (--load-timeout-seconds) for the loads before it"));
    }
    env_->WaitUntil(&room_freed_, &mu_, until);
  }
}

absl::Status ModelRepository::MakeRoom(const std::string& name, const std::string& device, int64_t budget, int64_t need,
                                       bool evict, LoadCause cause, absl::Time started) {
  using Verdict = RoomPlan::Verdict;
  while (true) {  // evictions a round, until the load fits or its wait ends
    Leaving leaving;
    RoomPlan plan;
    {
      MutexLock lock(&mu_);
      if (stopped_) return absl::CancelledError("not loaded: the server is shutting down");
      const absl::Time until = WaitUntilLocked(name, cause, started);
      const RoomAsk ask{budget, ledger_.Used(device), LeavingLocked(device), need, evict, env_->Now() >= until};
      plan = PlanRoom(ask, EvictableOnLocked(device, name));
      switch (plan.verdict) {
        case Verdict::kFits:
          return absl::OkStatus();
        case Verdict::kMoreThanTheBudget:
          return NoRoomLocked(name, device, budget, need, "; it needs more than the whole budget");
        case Verdict::kPollEvictsNothing:
          return NoRoomLocked(name, device, budget, need, "; a poll of the store evicts no other model");
        case Verdict::kTimedOut:
          if (cause == LoadCause::kDemand) return GaveUpLocked(name, "for room in the memory budget");
          return NoRoomLocked(name, device, budget, need, "; the models unloading did not free it in time");
        case Verdict::kWait:  // nothing to unload now: wait for the drained memory, or for a load under way to end
          env_->WaitUntil(&room_freed_, &mu_, until);
          continue;
        case Verdict::kEvict:
          break;
      }
      for (const Evictable& m : plan.evict) {
        RestLocked(m.name,
                   absl::StrCat("unloaded to make room for '", Capped(name), "' within the memory budget of ", device,
                                m.busy ? " (the least recently used model; its requests in flight were answered)"
                                       : " (the least recently used idle model)"),
                   &leaving);
      }
    }
    Announce(leaving);
    for (const Evictable& m : plan.evict) {
      if (options_.memory_event) options_.memory_event(m.name, false, "budget");
    }
    leaving.release.clear();  // idle ones go to the unloader now; busy ones once their last request is answered
  }
}

absl::StatusOr<ServableHandle> ModelRepository::MakeServableInBudget(const std::string& name, int64_t version,
                                                                     const StoreModel& found, uint64_t generation,
                                                                     LoadCause cause) {
  const bool budget = options_.memory_budget.enabled();
  const absl::Time started = env_->Now();
  // With a budget, one load at a time (its footprint is what the device gained), in its turn; without
  // one, loads run side by side and each footprint is measured as well as that allows.
  if (budget) {
    if (absl::Status turn = AwaitTurn(name, cause, started); !turn.ok()) return turn;
  }
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
    if (absl::Status room = MakeRoom(name, key, limit, need, evict, cause, started); !room.ok()) return room;
  }
  const int64_t before = meter_->InUse(*device);
  absl::StatusOr<ServableHandle> servable = MakeServable(name, version, found, generation);
  if (!servable.ok()) return servable;
  const int64_t bytes = declared.value_or(std::max<int64_t>(meter_->InUse(*device) - before, 0));
  if (budget) {
    // The file's size was a floor: when the version took more, room for the rest is made now. If
    // there is none, the version is let go (the unloader frees it).
    if (absl::Status room = MakeRoom(name, key, limit, bytes, evict, cause, started); !room.ok()) return room;
  }
  MutexLock lock(&mu_);
  ledger_.Charge(generation, key, bytes);
  return servable;
}

}  // namespace qvi

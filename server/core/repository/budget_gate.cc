#include "server/core/repository/budget_gate.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/model/cuda_support.h"
#include "server/core/request/request_checks.h"

namespace qvi {
namespace {

namespace fs = std::filesystem;

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

std::vector<Evictable> BudgetGate::EvictableOnLocked(const std::string& device, const std::string& except) const {
  std::vector<Evictable> found;
  for (const auto& [name, entry] : s_.models) {
    // A job of it running (not one merely queued: a poll tick queues one for every model, and the workers
    // may all be waiting for this load's turn to end).
    if (name == except || s_.turns.count(name) > 0) continue;
    Evictable m{name, 0, 0, false};
    bool loading = false;
    for (const auto& [_, r] : entry.versions) {
      loading = loading || r.status.state == ModelState::kLoading;
      if (r.status.state != ModelState::kReady || r.servable == nullptr) continue;
      // Under s_.mu nobody can take a new hold: one hold (ours) means no request has it.
      m.busy = m.busy || r.servable.use_count() > 1;
      m.bytes += s_.ledger.On(r.generation, device);
      m.last_used_ns = std::max(m.last_used_ns, r.servable->last_used_ns.load(std::memory_order_relaxed));
    }
    if (!loading && m.bytes > 0) found.push_back(m);
  }
  return found;
}

int64_t BudgetGate::LeavingLocked(const std::string& device) const {
  std::set<uint64_t> serving;
  for (const auto& [_, entry] : s_.models) {
    for (const auto& [v, r] : entry.versions) {
      if (r.status.state == ModelState::kReady) serving.insert(r.generation);
    }
  }
  return s_.ledger.Leaving(device, serving);
}

absl::Status BudgetGate::NoRoomLocked(const std::string& name, const std::string& device, int64_t budget, int64_t need,
                                      const char* why) const {
  std::vector<std::string> held;
  for (const auto& [n, entry] : s_.models) {
    int64_t bytes = 0;
    for (const auto& [v, r] : entry.versions) {
      bytes += s_.ledger.On(r.generation, device);
    }
    if (bytes > 0) held.push_back(absl::StrCat(n, " ", FormatBytes(bytes)));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("model '", Capped(name), "' needs about ", FormatBytes(need), " of ", device,
                   " and the memory budget (", FormatBytes(budget), ", --device-memory-budget) has ",
                   FormatBytes(std::max<int64_t>(budget - s_.ledger.Used(device), 0)),
                   " left; loaded: ", held.empty() ? "(none)" : absl::StrJoin(held, ", "), held.empty() ? "" : why));
}

absl::Time BudgetGate::WaitUntilLocked(const std::string& name, LoadCause cause, absl::Time started) const {
  absl::Time until = started + s_.options.load_timeout;
  if (cause != LoadCause::kDemand) return until;
  // Nobody waits any more: give up now.
  return std::min(until, s_.waiters.Latest(name, s_.env->Now()));
}

absl::Status BudgetGate::GaveUpLocked(const std::string& name, const char* waiting_for) const {
  // RESOURCE_EXHAUSTED: the model rests, and the next request for it loads it again.
  absl::Status status = absl::ResourceExhaustedError(absl::StrCat(
      "model '", Capped(name), "' waited ", waiting_for, " until the deadline of every request for it had passed"));
  status.SetPayload(kGaveUp, absl::Cord(name));
  return status;
}

absl::Status BudgetGate::AwaitTurn(const std::string& name, LoadCause cause, absl::Time started) {
  MutexLock lock(&s_.mu);
  while (true) {
    if (s_.stopped) return absl::CancelledError("not loaded: the server is shutting down");
    auto mine = s_.turns.find(name);
    if (mine == s_.turns.end()) return absl::OkStatus();  // a load outside a poll worker's job: none in tests
    bool first = true;
    for (const auto& [_, turn] : s_.turns) first = first && turn >= mine->second;
    if (first) return absl::OkStatus();
    const absl::Time until = WaitUntilLocked(name, cause, started);
    if (s_.env->Now() >= until) {
      return cause == LoadCause::kDemand
                 ? GaveUpLocked(name, "for the loads before it")
                 : absl::ResourceExhaustedError(absl::StrCat("model '", Capped(name), "' waited ",
                                                             absl::FormatDuration(s_.options.load_timeout),
                                                             " (--load-timeout-seconds) for the loads before it"));
    }
    s_.env->WaitUntil(&s_.room_freed, &s_.mu, until);
  }
}

absl::Status BudgetGate::MakeRoom(const std::string& name, const std::string& device, int64_t budget, int64_t need,
                                  bool evict, LoadCause cause, absl::Time started) {
  using Verdict = RoomPlan::Verdict;
  while (true) {  // evictions a round, until the load fits or its wait ends
    Leaving leaving;
    RoomPlan plan;
    {
      MutexLock lock(&s_.mu);
      if (s_.stopped) return absl::CancelledError("not loaded: the server is shutting down");
      const absl::Time until = WaitUntilLocked(name, cause, started);
      const RoomAsk ask{budget, s_.ledger.Used(device), LeavingLocked(device), need, evict, s_.env->Now() >= until};
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
          s_.env->WaitUntil(&s_.room_freed, &s_.mu, until);
          continue;
        case Verdict::kEvict:
          break;
      }
      for (const Evictable& m : plan.evict) {
        s_.RestLocked(
            m.name,
            absl::StrCat("unloaded to make room for '", Capped(name), "' within the memory budget of ", device,
                         m.busy ? " (the least recently used model; its requests in flight were answered)"
                                : " (the least recently used idle model)"),
            &leaving);
      }
    }
    s_.Announce(leaving);
    for (const Evictable& m : plan.evict) {
      if (s_.options.memory_event) s_.options.memory_event(m.name, false, "budget");
    }
    leaving.release.clear();  // idle ones go to the unloader now; busy ones once their last request is answered
  }
}

absl::StatusOr<ServableHandle> BudgetGate::MakeServable(const std::string& name, int64_t version,
                                                        const StoreModel& found, uint64_t generation, LoadCause cause) {
  const bool budget = s_.options.memory_budget.enabled();
  const absl::Time started = s_.env->Now();
  // With a budget, one load at a time (its footprint is what the device gained), in its turn; without
  // one, loads run side by side and each footprint is measured as well as that allows.
  if (budget) {
    if (absl::Status turn = AwaitTurn(name, cause, started); !turn.ok()) return turn;
  }
  absl::StatusOr<c10::Device> device = ResolveDevice(
      ResolvePlacement(s_.options.defaults, found.overrides.ok() ? *found.overrides : ServingOverrides{}).device);
  if (!device.ok()) return device.status();
  const std::string key = device->str();
  std::optional<int64_t> declared;
  if (found.overrides.ok()) declared = found.overrides->memory_bytes;
  const int64_t limit = budget ? s_.options.memory_budget.On(s_.meter->Capacity(*device)) : 0;
  const bool evict = cause != LoadCause::kPoll;
  if (budget) {
    const int64_t need = declared.value_or(LargestModelFile(s_.source.VersionDir(name, version)));
    if (absl::Status room = MakeRoom(name, key, limit, need, evict, cause, started); !room.ok()) return room;
  }
  const int64_t before = s_.meter->InUse(*device);
  absl::StatusOr<ServableHandle> servable = Read(name, version, found, generation);
  if (!servable.ok()) return servable;
  const int64_t bytes = declared.value_or(std::max<int64_t>(s_.meter->InUse(*device) - before, 0));
  if (budget) {
    // The file's size was a floor: when the version took more, room for the rest is made now. If
    // there is none, the version is let go (the unloader frees it).
    if (absl::Status room = MakeRoom(name, key, limit, bytes, evict, cause, started); !room.ok()) return room;
  }
  MutexLock lock(&s_.mu);
  s_.ledger.Charge(generation, key, bytes);
  return servable;
}

absl::StatusOr<ServableHandle> BudgetGate::Read(const std::string& name, int64_t version, const StoreModel& found,
                                                uint64_t generation) {
  if (!found.overrides.ok()) return found.overrides.status();  // a serving.json that cannot be read
  return loader_.Load(name, version, generation, s_.source.VersionDir(name, version), *found.overrides);
}

}  // namespace qvi

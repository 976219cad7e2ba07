#include "server/core/repository/memory_policy.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace qvi {

void MemoryLedger::Charge(uint64_t generation, const std::string& device, int64_t bytes) {
  charges_[generation] = Entry{device, bytes};
}

void MemoryLedger::Release(uint64_t generation) { charges_.erase(generation); }

int64_t MemoryLedger::Charged(uint64_t generation) const {
  auto charge = charges_.find(generation);
  return charge == charges_.end() ? 0 : charge->second.bytes;
}

int64_t MemoryLedger::On(uint64_t generation, const std::string& device) const {
  auto charge = charges_.find(generation);
  return charge != charges_.end() && charge->second.device == device ? charge->second.bytes : 0;
}

int64_t MemoryLedger::Used(const std::string& device) const {
  int64_t used = 0;
  for (const auto& [_, charge] : charges_) used += charge.device == device ? charge.bytes : 0;
  return used;
}

int64_t MemoryLedger::Leaving(const std::string& device, const std::set<uint64_t>& serving) const {
  int64_t leaving = 0;
  for (const auto& [generation, charge] : charges_) {
    if (charge.device == device && serving.count(generation) == 0) leaving += charge.bytes;
  }
  return leaving;
}

RoomPlan PlanRoom(const RoomAsk& ask, std::vector<Evictable> candidates) {
  using Verdict = RoomPlan::Verdict;
  if (ask.used + ask.need <= ask.budget) return {Verdict::kFits, {}};
  if (ask.need > ask.budget) return {Verdict::kMoreThanTheBudget, {}};
  if (!ask.may_evict) return {Verdict::kPollEvictsNothing, {}};
  if (ask.timed_out) return {Verdict::kTimedOut, {}};
  std::sort(candidates.begin(), candidates.end(), [](const Evictable& a, const Evictable& b) {
    return std::tie(a.busy, a.last_used_ns) < std::tie(b.busy, b.last_used_ns);
  });
  // Versions already unloading free their memory once their requests are answered.
  int64_t short_by = ask.used - ask.leaving + ask.need - ask.budget;
  int64_t evictable = 0;
  for (const Evictable& m : candidates) evictable += m.bytes;
  RoomPlan plan{Verdict::kWait, {}};
  if (evictable < short_by) return plan;  // unloading all of them would not make room
  for (Evictable& m : candidates) {
    if (short_by <= 0) break;
    short_by -= m.bytes;
    plan.evict.push_back(std::move(m));
  }
  if (!plan.evict.empty()) plan.verdict = Verdict::kEvict;
  return plan;
}

std::vector<std::string> IdleModels(const std::vector<ModelUse>& models, absl::Duration after, absl::Time now,
                                    absl::Time* next) {
  std::vector<std::string> idle;
  *next = std::min(*next, now + after);  // for versions READY from now on
  for (const ModelUse& m : models) {
    if (m.ready && !m.in_use && m.last + after <= now) {
      idle.push_back(m.name);
    } else if (m.ready) {
      *next = std::min(*next, m.in_use ? now + after : m.last + after);
    }
  }
  return idle;
}

}  // namespace qvi

#include "server/core/repository/load_waiters.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace qvi {

uint64_t LoadWaiters::LoadOf(const std::string& name) const {
  auto it = by_model_.find(name);
  return it == by_model_.end() ? 0 : it->second.load;
}

uint64_t LoadWaiters::Add(const std::string& name, Waiter waiter) {
  auto [it, first] = by_model_.try_emplace(name);
  if (first) it->second.load = next_load_++;
  it->second.waiters.push_back(std::move(waiter));
  return first ? it->second.load : 0;
}

std::vector<LoadWaiters::Waiter> LoadWaiters::Take(const std::string& name) {
  auto it = by_model_.find(name);
  if (it == by_model_.end()) return {};
  std::vector<Waiter> taken = std::move(it->second.waiters);
  by_model_.erase(it);
  return taken;
}

std::map<std::string, std::vector<LoadWaiters::Waiter>> LoadWaiters::TakeAll() {
  std::map<std::string, std::vector<Waiter>> all;
  for (auto& [name, waiting] : by_model_) all.emplace(name, std::move(waiting.waiters));
  by_model_.clear();
  return all;
}

absl::Time LoadWaiters::Latest(const std::string& name, absl::Time floor) const {
  absl::Time latest = floor;
  if (auto it = by_model_.find(name); it != by_model_.end()) {
    for (const Waiter& w : it->second.waiters) latest = std::max(latest, w.deadline);
  }
  return latest;
}

bool LoadWaiters::AnyAfter(const std::string& name, absl::Time now) const {
  auto it = by_model_.find(name);
  return it != by_model_.end() && std::any_of(it->second.waiters.begin(), it->second.waiters.end(),
                                              [now](const Waiter& w) { return w.deadline > now; });
}

std::vector<LoadWaiters::Waiter> LoadWaiters::Expire(absl::Time now, absl::Time* next) {
  std::vector<Waiter> expired;
  for (auto entry = by_model_.begin(); entry != by_model_.end();) {
    std::vector<Waiter>& waiting = entry->second.waiters;
    for (auto w = waiting.begin(); w != waiting.end();) {
      if (w->deadline > now) {
        *next = std::min(*next, w->deadline);
        ++w;
        continue;
      }
      expired.push_back(std::move(*w));
      w = waiting.erase(w);
    }
    entry = waiting.empty() ? by_model_.erase(entry) : std::next(entry);
  }
  return expired;
}

}  // namespace qvi

// The requests waiting for their model to load on demand (guarantee 9 of model_repository.h), by
// model, and the number of the load started for them: one load however many wait. The manager starts
// the loads, hands the waiters the version a load made READY and answers those whose deadline passed.
// Not thread-safe: the manager's lock guards it.
#ifndef QVI_SERVER_CORE_REPOSITORY_LOAD_WAITERS_H_
#define QVI_SERVER_CORE_REPOSITORY_LOAD_WAITERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/repository/servable.h"

namespace qvi {

class LoadWaiters {
 public:
  // A load on demand's answer to a request: the version it made READY (held), or why there is none.
  using Ready = std::function<void(absl::StatusOr<ServableHandle> loaded)>;
  struct Waiter {
    absl::Time deadline;
    Ready ready;
  };

  size_t models() const { return by_model_.size(); }  // the models requests wait for
  bool Waiting(const std::string& name) const { return by_model_.count(name) > 0; }
  // The number of the load the model's waiters wait for; 0 when none waits.
  uint64_t LoadOf(const std::string& name) const;
  // `waiter` joins the model's waiters. The first of a model gets a new load number, returned: the caller
  // starts that load. 0: a load is under way for the others.
  uint64_t Add(const std::string& name, Waiter waiter);
  // Every waiter of the model, which leaves.
  std::vector<Waiter> Take(const std::string& name);
  std::map<std::string, std::vector<Waiter>> TakeAll();
  // The latest deadline of the model's waiters, and never before `floor`.
  absl::Time Latest(const std::string& name, absl::Time floor) const;
  // Whether a waiter of the model has a deadline after `now`.
  bool AnyAfter(const std::string& name, absl::Time now) const;
  // The waiters whose deadline has come leave (a model nobody waits for any more leaves; its load
  // goes on for the next request); `next` lowered to the earliest deadline left.
  std::vector<Waiter> Expire(absl::Time now, absl::Time* next);

 private:
  struct Queue {
    uint64_t load = 0;
    std::vector<Waiter> waiters;  // never empty: the last to leave erases its model
  };
  std::map<std::string, Queue> by_model_;
  uint64_t next_load_ = 1;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_LOAD_WAITERS_H_

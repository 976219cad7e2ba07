// Guarantee 9 of model_repository.h, the requests' side: a request for a model that loads on demand
// waits for one load of it (however many wait), started as a control of its model; the requests are
// handed the version it made READY in the step that made it so, or its error, or DEADLINE_EXCEEDED at
// their deadlines. The keeper thread (keeper.h) answers those deadlines and unloads the models idle
// for Options::unload_idle_after (memory_policy.h's IdleModels chooses them).
#ifndef QVI_SERVER_CORE_REPOSITORY_DEMAND_LOADS_H_
#define QVI_SERVER_CORE_REPOSITORY_DEMAND_LOADS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/core/repository/admin_control.h"
#include "server/core/repository/keeper.h"
#include "server/core/repository/load_waiters.h"
#include "server/core/repository/repository_state.h"
#include "server/core/repository/servable.h"

namespace qvi {

class DemandLoads {
 public:
  using Waiter = LoadWaiters::Waiter;

  DemandLoads(RepositoryState* state, AdminControl* control) : s_(*state), control_(*control) {}

  // Starts the keeper thread when the options ask for it (unload_idle_after, load_on_demand).
  void Start();
  // Stops the keeper thread: no idle unload and no deadline answered from here on.
  void Stop();

  // ModelRepository::WhenLoaded: see model_repository.h.
  void WhenLoaded(const std::string& name, absl::Time deadline, LoadWaiters::Ready ready) ABSL_LOCKS_EXCLUDED(s_.mu);

 private:
  using Leaving = RepositoryState::Leaving;
  // Load on demand number `load` has ended: its waiters get the newest READY version, else `result`'s
  // error. OK with no READY version (unloaded again meanwhile): the model is loaded once more for them.
  // Waiters that came after that load gave up wait for a load of their own, not for this answer.
  void Answer(const std::string& name, uint64_t load, const absl::Status& result) ABSL_LOCKS_EXCLUDED(s_.mu);
  void StartDemandLoad(const std::string& name, uint64_t load) ABSL_LOCKS_EXCLUDED(s_.mu);
  // The keeper's pass: what is due now is done; returns when the next thing falls due.
  absl::Time KeepOnce() ABSL_LOCKS_EXCLUDED(s_.mu);
  // The models idle for unload_idle_after (IdleModels); `next` lowered to when the next one may be.
  std::vector<std::string> IdleModelsLocked(absl::Time now, absl::Time* next) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  RepositoryState& s_;
  AdminControl& control_;
  std::unique_ptr<Keeper> keeper_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_DEMAND_LOADS_H_

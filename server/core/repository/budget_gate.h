// Guarantee 9 of model_repository.h, the loads' side: a version made within the memory budget of its
// device. With a budget, loads are measured one at a time in the order the poll workers took them up
// (their turns); a load that would pass the budget makes room first -- evicting, as memory_policy.h's
// PlanRoom chooses, only when the load was asked for -- or waits for versions unloading, until the
// latest deadline of the requests waiting for it; then its footprint is measured and charged.
#ifndef QVI_SERVER_CORE_REPOSITORY_BUDGET_GATE_H_
#define QVI_SERVER_CORE_REPOSITORY_BUDGET_GATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/repository/memory_policy.h"
#include "server/core/repository/repository_state.h"
#include "server/core/repository/repository_types.h"
#include "server/core/repository/servable.h"
#include "server/core/repository/version_loader.h"

namespace qvi {

class BudgetGate {
 public:
  BudgetGate(RepositoryState* state, VersionLoader* loader) : s_(*state), loader_(*loader) {}

  // The version read by the lifecycle with the scan's serving.json, within the budget: in its turn, room
  // made first (evicting when `cause` asks for the model), the footprint measured and charged to
  // `generation`. Without a budget, only measured.
  absl::StatusOr<ServableHandle> MakeServable(const std::string& name, int64_t version, const StoreModel& found,
                                              uint64_t generation, LoadCause cause) ABSL_LOCKS_EXCLUDED(s_.mu);

 private:
  using Leaving = RepositoryState::Leaving;
  // Until the load of `name` is the earliest taken up of those running (turns): OK, or why it gave up.
  absl::Status AwaitTurn(const std::string& name, LoadCause cause, absl::Time started) ABSL_LOCKS_EXCLUDED(s_.mu);
  // Until `need` more bytes fit `budget` on `device`, as PlanRoom decides: waits for versions already
  // unloading, evicts when `evict`, else RESOURCE_EXHAUSTED saying what holds it.
  absl::Status MakeRoom(const std::string& name, const std::string& device, int64_t budget, int64_t need, bool evict,
                        LoadCause cause, absl::Time started) ABSL_LOCKS_EXCLUDED(s_.mu);
  // How long a load of `name` begun at `started` may wait for its turn and for room: load_timeout, and
  // for a load on demand the latest deadline of its requests (now when none waits any more).
  absl::Time WaitUntilLocked(const std::string& name, LoadCause cause, absl::Time started) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // A load on demand whose requests all left (their deadlines passed) gives up waiting.
  absl::Status GaveUpLocked(const std::string& name, const char* waiting_for) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // The bytes on `device` of the versions no longer READY (unloading): free once their requests are answered.
  int64_t LeavingLocked(const std::string& device) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // RESOURCE_EXHAUSTED: what `name` needs, what is left, which models hold the device, and `why`.
  absl::Status NoRoomLocked(const std::string& name, const std::string& device, int64_t budget, int64_t need,
                            const char* why) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // The READY models holding memory on `device` (not `except`, none with a poll or load under way).
  std::vector<Evictable> EvictableOnLocked(const std::string& device, const std::string& except) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // The lifecycle's load of the version with the scan's serving.json (its error when that could not be read).
  absl::StatusOr<ServableHandle> Read(const std::string& name, int64_t version, const StoreModel& found,
                                      uint64_t generation) ABSL_LOCKS_EXCLUDED(s_.mu);

  RepositoryState& s_;
  VersionLoader& loader_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_BUDGET_GATE_H_

// What the parts of the model repository share under its one lock (model_repository.h): every model's
// versions and what is under way for them -- polls queued and running, admin controls, models resting,
// the memory charged, the requests waiting for a load. The manager (ModelRepository), the admin's
// control (admin_control.h), the listing and resolution (catalog.h), the budget (budget_gate.h) and the
// loads on demand (demand_loads.h) each hold a reference to it; one lock keeps their steps atomic
// together (a version handed to its waiters in the step that made it READY, a model evicted in the step
// that chose it).
#ifndef QVI_SERVER_CORE_REPOSITORY_REPOSITORY_STATE_H_
#define QVI_SERVER_CORE_REPOSITORY_REPOSITORY_STATE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "server/core/base/env.h"
#include "server/core/base/sync.h"
#include "server/core/repository/load_waiters.h"
#include "server/core/repository/memory_policy.h"
#include "server/core/repository/repository_types.h"
#include "server/core/repository/servable.h"
#include "server/core/store/store_source.h"
#include "server/core/store/version_policy.h"

namespace qvi {

class RepositoryState {
 public:
  struct Record {
    VersionStatus status;
    ServableHandle servable;  // READY only: the repository's own hold
    FileStamp stamp;          // what the last load attempt saw of its files
    uint64_t generation = 0;  // tells a reloaded version from the one still unloading
    absl::Time loaded;        // READY since
  };
  struct Entry {
    std::map<int64_t, Record> versions;
    VersionPolicy policy;
    std::optional<ShadowSettings> shadow;  // serving.json's: that version answers no request without a version
  };
  // One model for a poll worker: what the scan found of it, none when its folder (or its last
  // version) is gone.
  struct Job {
    std::string name;
    std::optional<StoreModel> found;
    std::vector<std::function<void()>> done;  // model control's answers, once the poll of the model ends
    LoadCause cause = LoadCause::kPoll;
  };
  // Versions taken out of service under the lock: reported (Announce) and let go of after it.
  struct Leaving {
    std::vector<ServableHandle> release;
    std::vector<std::pair<std::string, VersionStatus>> unloading;
  };

  explicit RepositoryState(RepositoryOptions o);

  // `entry`'s shadow candidate with an admin's override applied (SetShadow wins over serving.json's): its version,
  // 0 for none.
  int64_t ShadowLocked(const std::string& name, Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // ModelRepository::SetShadow.
  absl::Status SetShadow(const std::string& name, std::optional<ShadowSettings> shadow) ABSL_LOCKS_EXCLUDED(mu);
  // Tells the listener of one state change, or of what left service; outside the lock.
  void Notify(const std::string& name, const VersionStatus& status) const;
  void Announce(const Leaving& leaving) const ABSL_LOCKS_EXCLUDED(mu);
  // A servable handed out, its last use now.
  ServableHandle Used(const ServableHandle& servable) const;
  // Takes every READY version of `name` out of service (state UNLOADING, `reason`) and lets it rest.
  void RestLocked(const std::string& name, const std::string& reason, Leaving* leaving)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What a poll of `name` is handed of the scan `disk`: its folder, unless model control is explicit
  // and the model is not wanted (then, as a folder gone, its versions are unloaded), or it rests.
  std::optional<StoreModel> FoundLocked(const std::string& name, std::map<std::string, StoreModel>& disk) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A poll handed no folder (`found` null) for a model still in the store and no longer wanted: its
  // versions leave by an admin's unload, not because the folder went (what the version policy says).
  bool UnloadedByAdminLocked(const std::string& name, const StoreModel* found) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A model asked for again: no longer resting, its versions the budget refused (FAILED) tried again.
  void WakeLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // `servable` is READY: the waiters of its model, moved to `answered`, are handed it (in the step
  // that made it READY: no other load can unload it before they hold it).
  void HandOverLocked(const std::string& name, const ServableHandle& servable,
                      std::vector<std::pair<LoadWaiters::Waiter, ServableHandle>>* answered)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  const RepositoryOptions options;
  const StoreSource source;
  const Env* const env;
  const MemoryMeter* const meter;

  mutable Mutex mu;
  std::map<std::string, Entry> models ABSL_GUARDED_BY(mu);
  uint64_t next_generation ABSL_GUARDED_BY(mu) = 1;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  CondVar poll_wake;                           // the poll interval's end, or the stop
  bool poll_soon ABSL_GUARDED_BY(mu) = false;  // poll now, not at the interval's end (SetShadow)
  // An admin's shadow candidate per model (ModelRepository::SetShadow), over serving.json's: nullopt, none.
  std::map<std::string, std::optional<ShadowSettings>> shadow_overrides ABSL_GUARDED_BY(mu);
  CondVar jobs_changed;  // a job queued, a model no longer busy, or the stop
  // A charge dropped, a turn or a job ended, a waiter came or left, or the stop.
  CondVar room_freed;
  // The poll workers: models queued for them, and the models queued or being polled.
  std::deque<Job> jobs ABSL_GUARDED_BY(mu);
  std::set<std::string> busy ABSL_GUARDED_BY(mu);
  // The running poll workers' jobs by model, numbered as they were taken up: the budget's turns.
  std::map<std::string, uint64_t> turns ABSL_GUARDED_BY(mu);
  uint64_t next_turn ABSL_GUARDED_BY(mu) = 0;
  // Model control: the models served when it is explicit, the store's folders at the last scan, and
  // the answers of controls that came while their model was busy (run by a poll of their own).
  std::set<std::string> wanted ABSL_GUARDED_BY(mu);
  std::set<std::string> on_disk ABSL_GUARDED_BY(mu);
  std::map<std::string, std::vector<std::function<void()>>> again ABSL_GUARDED_BY(mu);
  std::map<std::string, LoadCause> again_load ABSL_GUARDED_BY(mu);  // of those, the loads: why
  // Guarantee 9: the models resting and why; each servable's footprint; the requests waiting for a
  // load on demand, by model.
  std::map<std::string, std::string> resting ABSL_GUARDED_BY(mu);
  MemoryLedger ledger ABSL_GUARDED_BY(mu);
  LoadWaiters waiters ABSL_GUARDED_BY(mu);
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_REPOSITORY_STATE_H_

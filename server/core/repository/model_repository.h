// The manager of the model store's versions (Triton's ModelRepositoryManager): which versions are
// wanted and when they load and unload. What is on disk comes from a StoreSource scan (store_source.h:
// <root>/<model-name>/<version>/ holding model.pt and/or model.cpu.pt2, model.cuda.pt2; Model::Load
// picks the file); which versions to serve comes from SelectVersions (version_policy.h); a version's
// load with its timeout and its unloading are the lifecycle's (version_loader.h); the budget's
// choices are memory_policy.h's, the requests waiting for a load load_waiters.h's. The manager
// applies them all under one lock, on its poll workers.
//
// Guarantees:
//  1. Each model's version policy (serving.json `version_policy`, else the server's default,
//     latest:1) decides which versions are loaded; see VersionPolicy in serving_config.h.
//  2. Poll() (at start-up, then every --poll-store-seconds on a background thread) notices new,
//     replaced and removed versions. A new version loads while the old ones keep serving; it
//     becomes visible to Resolve() in one step under the lock (the atomic switch); only then are
//     the versions it replaces taken out of service.
//  3. A version taken out of service is UNLOADING: Resolve() no longer hands it out, and the
//     lifecycle unloads it once the last request holding it has been answered (version_loader.h,
//     guarantee 3); then it leaves the listing. Nothing in flight is cut off.
//  4. A version that fails to load (corrupt file, bad manifest, bad serving.json, warm-up error) is
//     FAILED with the reason and nothing else changes. It is tried again only when one of its
//     model files or the model's serving.json changes, so a half-copied file heals once the copy completes.
//  5. Every state change is reported to the listener (to log it and to update health).
//  6. Models are polled on Options::load_threads workers, one model per worker at a time, and a
//     poll passes over a model whose previous poll is still loading: one slow or stuck model holds
//     up no other model's rollout, and the background poller never waits for a load. A load that
//     the lifecycle abandons (Options::load_timeout, or Shutdown(); version_loader.h, guarantee 1)
//     leaves the version FAILED with that reason, retried when its files change, like any failure.
//  7. A READY version whose model files change in place (same version number, other bytes) is
//     loaded again from the new files, like a new version: the loaded one serves until the reload
//     is READY, then is switched out atomically and drains. A reload that fails leaves the loaded
//     files serving (the reason shows in ListModels) and is tried again when the files change
//     again. Either way Options::files_changed hears of it. A changed serving.json alone reloads
//     nothing: it applies to versions loaded from then on.
//  8. Model control (Options::model_control). kPoll: every model in the store is served. kExplicit:
//     only the models an admin loaded (RequestLoad, and Options::load_at_start) -- their versions
//     follow guarantees 1-7 -- and RequestUnload takes a model's versions out of service as removing
//     its folder would (guarantee 3: what is in flight is answered by the version it was resolved
//     to, then the version drains). A load or unload runs on a poll worker like a poll of that model,
//     after any poll of it in progress, and its `done` runs once, when it has finished (a load: READY,
//     or why not); at Shutdown() with UNAVAILABLE if it never ran.
//  9. Memory (Options::memory_budget, memory_budget.h). Each version's footprint on its device is
//     measured at its load (or taken from serving.json's `memory_bytes`) and reported in its status.
//     With a budget, loads are measured one at a time, in the order the poll workers took them up,
//     and a load that would pass its device's budget makes room first, but only when the load was asked
//     for (RequestLoad, a request with load-on-demand); a poll's load never evicts. Room is made by
//     unloading models least recently asked for first: idle ones (every READY version free of
//     requests) before busy ones, which are taken out of service and drain (guarantee 3) -- a model
//     whose callers overlap is never idle, and waiting for that moment would starve the load. The
//     load waits for the drained memory until the latest deadline of the requests waiting for it
//     (RequestLoad: Options::load_timeout). It is refused at once (RESOURCE_EXHAUSTED naming what it
//     needs and what holds the device) only when it needs more than the whole budget, and when its
//     requests' deadlines pass first. At most Options::max_waiting_loads models load on demand at
//     once; a request for another is refused at once. A model so unloaded (evicted, refused, or idle for
//     Options::unload_idle_after) *rests*: in the store, not loaded, its reason given by Resolve()
//     and Index(), not loaded again by a poll; RequestLoad or a request (Options::load_on_demand,
//     WhenLoaded) brings it back. The requests that waited for a load are handed the version it made
//     READY, in the same step: no other load can unload it before they hold it. The unit is the
//     model: its version policy decides its versions. Which models to unload, and when a model is
//     idle, are memory_policy.h's choices; the keeper thread (keeper.h) runs the timed ones.
#ifndef QVI_SERVER_CORE_REPOSITORY_MODEL_REPOSITORY_H_
#define QVI_SERVER_CORE_REPOSITORY_MODEL_REPOSITORY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/model/model.h"
#include "server/core/repository/keeper.h"
#include "server/core/repository/load_waiters.h"
#include "server/core/repository/memory_budget.h"
#include "server/core/repository/memory_policy.h"
#include "server/core/repository/servable.h"
#include "server/core/repository/version_loader.h"
#include "server/core/runner/observer.h"
#include "server/core/sched/env.h"
#include "server/core/sched/sync.h"
#include "server/core/store/store_source.h"
#include "server/core/store/version_policy.h"

namespace qvi {

// Which models are served (--model-control): the store's (kPoll), or those loaded over the wire (kExplicit).
enum class ModelControl { kPoll, kExplicit };

struct ModelStatus {
  std::string name;
  std::string version_policy;
  std::vector<VersionStatus> versions;  // newest first
  std::string not_loaded;               // Index(): why a model with no versions is not loaded ("" not asked)
};

// Why a model was loaded (a poll of the store, an admin's RequestLoad, a request with load-on-demand)
// or unloaded to save memory (the budget, idleness): metrics labels.
enum class LoadCause { kPoll, kAdmin, kDemand };
const char* LoadCauseName(LoadCause cause);

// The payload of a load on demand's refusal when it gave up because its requests had all left.
extern const char kGaveUp[];

// UNAVAILABLE from Resolve() for a model that loads on demand: the caller hands the request to
// ModelRepository::WhenLoaded and tries again once.
bool WaitsForLoad(const absl::Status& status);

class ModelRepository {
 public:
  // Called after each state change, outside the repository's lock, from the thread that made it.
  using Listener = std::function<void(const std::string& name, const VersionStatus&)>;

  struct Options {
    std::string root;
    ServingConfig defaults;        // the server's; a model's manifest and serving.json refine them
    VersionPolicy version_policy;  // for models whose serving.json names none
    // Time and threads: the poll interval, load timeouts, the batch queues. Env::Default() when null.
    const Env* env = nullptr;
    Listener listener;
    ServingObserver* observer = nullptr;  // metrics of every version's batches; may be null
    Executor* answers = nullptr;          // makes every version's answers (ModelRunner); null: the instance threads do
    bool pipeline = true;                 // ModelRunner's pipeline, where the model is asynchronous
    absl::Duration load_timeout = absl::Minutes(10);  // per version: Model::Load with its warm-up
    int load_threads = 4;                             // models polled (and loaded) at once
    // CUDA graphs (graphs.h): the backend, null when this process has none, and why.
    GraphBackend* graph_backend = nullptr;
    std::string graph_backend_note = "no CUDA graph backend in this process";
    // Reads and warms up one version; Model::Load unless a test puts a fake here.
    std::function<absl::StatusOr<std::unique_ptr<Model>>(const std::string& dir, const LoadOptions& options)> load;
    // After each reload of a READY version whose model files changed (guarantee 7): OK when the new
    // files serve, else why the loaded files still do. From a poll worker, outside the lock.
    std::function<void(const std::string& name, int64_t version, const absl::Status& reload)> files_changed;
    ModelControl model_control = ModelControl::kPoll;
    // kExplicit: the models loaded at start-up (--load-model); "*" is every model the store holds then.
    std::vector<std::string> load_at_start;
    // Guarantee 9. Not enabled: no budget (footprints are measured all the same).
    MemoryBudget memory_budget;
    const MemoryMeter* meter = nullptr;  // SystemMemoryMeter() when null
    // A model no request asked for in this long is unloaded (it rests); zero: never.
    absl::Duration unload_idle_after = absl::ZeroDuration();
    // A request for a resting model (or, explicit, one in the store not loaded) loads it (WhenLoaded).
    bool load_on_demand = false;
    // Models loading on demand at once, each however many requests wait for it; more are refused.
    int max_waiting_loads = 8;
    // A model loaded, or unloaded to save memory: `reason` is LoadCauseName's, or "budget"/"idle".
    std::function<void(const std::string& name, bool loaded, const char* reason)> memory_event;
  };
  using ControlDone = std::function<void(const absl::Status& result)>;
  // A load on demand's answer to a request: the version it made READY (held), or why there is none.
  using LoadedDone = LoadWaiters::Ready;

  static absl::StatusOr<std::unique_ptr<ModelRepository>> Create(Options options);
  ~ModelRepository();

  // Scans the store once and applies every model's version policy: loads, retries and takes out of
  // service as needed, each model on a poll worker. A model still busy with an earlier poll is
  // passed over. Returns once every model it handed out is done, or once Shutdown() begins.
  void Poll() ABSL_LOCKS_EXCLUDED(mu_);

  // Scans and hands models out like Poll() every `interval` on a background thread until
  // Shutdown(), without waiting for their loads.
  void StartPolling(absl::Duration interval) ABSL_LOCKS_EXCLUDED(mu_);

  // The servable for a request: version 0 = the newest READY version. NOT_FOUND names what exists;
  // UNAVAILABLE says why the version cannot serve (failed, unloading, shutting down).
  absl::StatusOr<ServableHandle> Resolve(const std::string& name, int64_t version) const ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<ModelStatus> List() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every model the store holds or the repository serves, by name; a model not loaded has no versions.
  std::vector<ModelStatus> Index() const ABSL_LOCKS_EXCLUDED(mu_);

  // Guarantee 8 (kExplicit only; FAILED_PRECONDITION otherwise). RequestLoad: serve the model (or apply
  // what changed in its folder, when it is served already); `done` gets OK once a version is READY,
  // else why none is. NOT_FOUND when the store has no such model. RequestUnload: take every version of
  // the model out of service; `done` gets OK once none is handed out any more (they drain after).
  // `done` may run on the caller's thread (a refusal) or on a poll worker.
  void RequestLoad(const std::string& name, ControlDone done) ABSL_LOCKS_EXCLUDED(mu_);
  void RequestUnload(const std::string& name, ControlDone done) ABSL_LOCKS_EXCLUDED(mu_);
  ModelControl model_control() const { return options_.model_control; }
  // With load_on_demand, for a request whose Resolve() said WaitsForLoad: loads the model (one load
  // however many wait) and calls `ready` once: with the newest READY version, held for the request
  // (serve it rather than resolving again), its error, or DEADLINE_EXCEEDED at `deadline` (Env time)
  // if the load has not ended by then. RESOURCE_EXHAUSTED at once when max_waiting_loads other
  // models are loading on demand. From the caller's thread, a poll worker or the keeper.
  void WhenLoaded(const std::string& name, absl::Time deadline, LoadedDone ready) ABSL_LOCKS_EXCLUDED(mu_);
  // The environment the versions run in: their batch queues' clock is this one's.
  const Env* env() const { return env_; }
  bool Has(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ModelStatus> Get(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);

  // Stops polling, abandons the loads in progress (their versions FAILED), takes every version out
  // of service and returns once each has finished the requests that hold it and is unloaded. Never
  // waits for a load. Later Resolve() calls get UNAVAILABLE. May be called from any thread, also
  // while another thread is in Poll(), and more than once, but not from two threads at once.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // The loads abandoned (timed out or at Shutdown()) whose threads have not returned: "name@version
  // (running for 12s)". What a process must not wait for when it exits.
  std::vector<std::string> LoadsStillRunning() const { return loader_.StillRunning(); }

 private:
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
  };
  // One model for a poll worker: what the scan found of it, none when its folder (or its last
  // version) is gone.
  struct Job {
    std::string name;
    std::optional<StoreModel> found;
    std::vector<std::function<void()>> done;  // model control's answers, once the poll of the model ends
    LoadCause cause = LoadCause::kPoll;
  };
  using Waiter = LoadWaiters::Waiter;
  // Versions taken out of service under the lock: let go of and reported after it.
  struct Leaving {
    std::vector<ServableHandle> release;
    std::vector<std::pair<std::string, VersionStatus>> unloading;
  };

  explicit ModelRepository(Options options);

  // Scans the store and queues every model not busy for the workers; returns the names queued.
  std::vector<std::string> Dispatch() ABSL_LOCKS_EXCLUDED(mu_);
  // What a poll of `name` is handed of the scan `disk`: its folder, unless model control is explicit
  // and the model is not wanted (then, as a folder gone, its versions are unloaded).
  std::optional<StoreModel> FoundLocked(const std::string& name, std::map<std::string, StoreModel>& disk) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A poll handed no folder (`found` null) for a model still in the store and no longer wanted: its
  // versions leave by an admin's unload, not because the folder went (what the version policy says).
  bool UnloadedByAdminLocked(const std::string& name, const StoreModel* found) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Control(const std::string& name, bool load, LoadCause cause, ControlDone done) ABSL_LOCKS_EXCLUDED(mu_);
  // A control's answer once its poll ended: a load is OK with a READY version, else why there is none.
  absl::Status ControlResult(const std::string& name, bool load) const ABSL_LOCKS_EXCLUDED(mu_);
  // After a worker's poll of `name`: queues the controls that came while it ran (a poll of their own),
  // or frees the model for the next poll.
  void FinishJob(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // Options::load_at_start into wanted_: INVALID_ARGUMENT naming a model the store does not hold.
  absl::Status WantAtStart() ABSL_LOCKS_EXCLUDED(mu_);
  // UNAVAILABLE: `name` is in the store and not loaded (model control is explicit).
  static absl::Status NotLoaded(const std::string& name);
  // UNAVAILABLE with WaitsForLoad's mark.
  static absl::Status LoadsOnDemand(const std::string& name);
  // Resolve()'s answer for a model it has no record of, or one resting or not loaded; OK when it has one.
  absl::Status NotServedLocked(const std::string& name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A servable Resolve() hands out, its last use now.
  ServableHandle Used(const ServableHandle& servable) const;
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Run by a poll worker, one worker per model name at a time (busy_).
  void PollModel(const std::string& name, const StoreModel* found, LoadCause cause);
  // READY versions whose model files on disk are no longer those they were loaded from.
  std::vector<int64_t> ChangedReadyVersions(const std::string& name, const StoreModel& found) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // What SelectVersions needs of the model's records.
  std::map<int64_t, KnownVersion> Known(const std::string& name, const StoreModel* found) const
      ABSL_LOCKS_EXCLUDED(mu_);
  enum class LoadResult { kReady, kFailed, kShuttingDown };
  LoadResult Load(const std::string& name, int64_t version, const StoreModel& found, LoadCause cause);
  // Guarantee 7: loads a READY version again from its changed files and swaps it in.
  LoadResult Reload(const std::string& name, int64_t version, const StoreModel& found);
  // The lifecycle's load of the version with the scan's serving.json (its error when that could not be read).
  absl::StatusOr<ServableHandle> MakeServable(const std::string& name, int64_t version, const StoreModel& found,
                                              uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);
  // The lifecycle freed a servable: its record (when still UNLOADING) and its charge go.
  void Unloaded(const std::string& name, int64_t version, uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);
  void Notify(const std::string& name, const VersionStatus& status) const;
  // Tells the listener what left service; the caller lets go of the holds after its own events.
  void Announce(const Leaving& leaving) const ABSL_LOCKS_EXCLUDED(mu_);

  // Guarantee 9 (model_repository_budget.cc). MakeServable within the budget: in its turn, room made
  // first (evicting when `cause` asks for the model), the footprint measured and charged to `generation`.
  absl::StatusOr<ServableHandle> MakeServableInBudget(const std::string& name, int64_t version, const StoreModel& found,
                                                      uint64_t generation, LoadCause cause) ABSL_LOCKS_EXCLUDED(mu_);
  // Until the load of `name` is the earliest taken up of those running (turns_): OK, or why it gave up.
  absl::Status AwaitTurn(const std::string& name, LoadCause cause, absl::Time started) ABSL_LOCKS_EXCLUDED(mu_);
  // Until `need` more bytes fit `budget` on `device`, as PlanRoom decides: waits for versions already
  // unloading, evicts when `evict`, else RESOURCE_EXHAUSTED saying what holds it.
  absl::Status MakeRoom(const std::string& name, const std::string& device, int64_t budget, int64_t need, bool evict,
                        LoadCause cause, absl::Time started) ABSL_LOCKS_EXCLUDED(mu_);
  // How long a load of `name` begun at `started` may wait for its turn and for room: load_timeout, and
  // for a load on demand the latest deadline of its requests (now when none waits any more).
  absl::Time WaitUntilLocked(const std::string& name, LoadCause cause, absl::Time started) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A load on demand whose requests all left (their deadlines passed) gives up waiting.
  absl::Status GaveUpLocked(const std::string& name, const char* waiting_for) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes on `device` of the versions no longer READY (unloading): free once their requests are answered.
  int64_t LeavingLocked(const std::string& device) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED: what `name` needs, what is left, which models hold the device, and `why`.
  absl::Status NoRoomLocked(const std::string& name, const std::string& device, int64_t budget, int64_t need,
                            const char* why) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The READY models holding memory on `device` (not `except`, none with a poll or load under way).
  std::vector<Evictable> EvictableOnLocked(const std::string& device, const std::string& except) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes every READY version of `name` out of service (state UNLOADING, `reason`) and lets it rest.
  void RestLocked(const std::string& name, const std::string& reason, Leaving* leaving)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The keeper's pass (unload_idle_after, load_on_demand): what is due now is done; returns when the
  // next thing falls due.
  absl::Time KeepOnce() ABSL_LOCKS_EXCLUDED(mu_);
  // The models idle for unload_idle_after (IdleModels); `next` lowered to when the next one may be.
  std::vector<std::string> IdleModelsLocked(absl::Time now, absl::Time* next) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Load on demand number `load` has ended: its waiters get the newest READY version, else `result`'s
  // error. OK with no READY version (unloaded again meanwhile): the model is loaded once more for them.
  // Waiters that came after that load gave up wait for a load of their own, not for this answer.
  void Answer(const std::string& name, uint64_t load, const absl::Status& result) ABSL_LOCKS_EXCLUDED(mu_);
  void StartDemandLoad(const std::string& name, uint64_t load) ABSL_LOCKS_EXCLUDED(mu_);
  // A model asked for again: no longer resting, its versions the budget refused (FAILED) tried again.
  void WakeLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `servable` is READY: the waiters of its model, moved to `answered`, are handed it.
  void HandOverLocked(const std::string& name, const ServableHandle& servable,
                      std::vector<std::pair<Waiter, ServableHandle>>* answered) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const StoreSource source_;
  const Env* env_;
  const MemoryMeter* meter_;

  mutable Mutex mu_;
  std::map<std::string, Entry> models_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  CondVar poll_wake_;
  std::thread poller_;
  // The poll workers: models queued for them, and the models queued or being polled.
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> busy_ ABSL_GUARDED_BY(mu_);
  // Model control: the models served when it is explicit, the store's folders at the last scan, and
  // the answers of controls that came while their model was busy (run by a poll of their own).
  std::set<std::string> wanted_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> on_disk_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::function<void()>>> again_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, LoadCause> again_load_ ABSL_GUARDED_BY(mu_);  // of those, the loads: why
  // Guarantee 9: the models resting and why; each servable's footprint; the requests waiting for a
  // load on demand, by model.
  std::map<std::string, std::string> resting_ ABSL_GUARDED_BY(mu_);
  MemoryLedger ledger_ ABSL_GUARDED_BY(mu_);
  LoadWaiters waiters_ ABSL_GUARDED_BY(mu_);
  CondVar room_freed_;  // a charge dropped, a turn or a job ended, a waiter came or left, or the stop
  // The running poll workers' jobs by model, numbered as they were taken up: the budget's turns.
  std::map<std::string, uint64_t> turns_ ABSL_GUARDED_BY(mu_);
  uint64_t next_turn_ ABSL_GUARDED_BY(mu_) = 0;
  CondVar jobs_changed_;  // a job queued, a model no longer busy, or the stop
  std::vector<std::thread> workers_;
  // After the state its threads touch, so that they are stopped before it goes.
  VersionLoader loader_;
  std::unique_ptr<Keeper> keeper_;  // with unload_idle_after or load_on_demand
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_MODEL_REPOSITORY_H_

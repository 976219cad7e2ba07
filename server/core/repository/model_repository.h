// The manager of the model store's versions (Triton's ModelRepositoryManager): which versions are
// wanted and when they load and unload. What is on disk comes from a StoreSource scan (store_source.h:
// <root>/<model-name>/<version>/ holding model.pt and/or model.cpu.pt2, model.cuda.pt2; Model::Load
// picks the file); which versions to serve comes from SelectVersions (version_policy.h). The manager
// polls the store on its poll workers and applies the policies; its parts share one state under one
// lock (repository_state.h):
//   version_loader.h  a version's lifecycle: the load with its timeout, the unloading (Triton's
//                     ModelLifeCycle)
//   admin_control.h   explicit model control: the loads and unloads asked for, run as polls (8)
//   catalog.h         Resolve() and the listings
//   budget_gate.h     a load within the memory budget: turns, room, the footprint charged (9)
//   demand_loads.h    loads on demand, the keeper's idle unloads (9); load_waiters.h its requests
//   memory_policy.h   the budget's choices, pure: what to unload for room, which models are idle
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
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/base/env.h"
#include "server/core/base/sync.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/model/model.h"
#include "server/core/repository/admin_control.h"
#include "server/core/repository/budget_gate.h"
#include "server/core/repository/catalog.h"
#include "server/core/repository/demand_loads.h"
#include "server/core/repository/load_waiters.h"
#include "server/core/repository/memory_budget.h"
#include "server/core/repository/repository_state.h"
#include "server/core/repository/repository_types.h"
#include "server/core/repository/servable.h"
#include "server/core/repository/version_loader.h"
#include "server/core/store/store_source.h"
#include "server/core/store/version_policy.h"

namespace qvi {

class ModelRepository {
 public:
  using Options = RepositoryOptions;
  using Listener = RepositoryOptions::Listener;
  using ControlDone = AdminControl::ControlDone;
  // A load on demand's answer to a request: the version it made READY (held), or why there is none.
  using LoadedDone = LoadWaiters::Ready;

  static absl::StatusOr<std::unique_ptr<ModelRepository>> Create(Options options);
  ~ModelRepository();

  // Scans the store once and applies every model's version policy: loads, retries and takes out of
  // service as needed, each model on a poll worker. A model still busy with an earlier poll is
  // passed over. Returns once every model it handed out is done, or once Shutdown() begins.
  void Poll() ABSL_LOCKS_EXCLUDED(s_.mu);

  // Scans and hands models out like Poll() every `interval` on a background thread until
  // Shutdown(), without waiting for their loads.
  void StartPolling(absl::Duration interval) ABSL_LOCKS_EXCLUDED(s_.mu);

  // The servable for a request: version 0 = the newest READY version. NOT_FOUND names what exists;
  // UNAVAILABLE says why the version cannot serve (failed, unloading, shutting down).
  absl::StatusOr<ServableHandle> Resolve(const std::string& name, int64_t version) const ABSL_LOCKS_EXCLUDED(s_.mu) {
    return catalog_.Resolve(name, version);
  }

  std::vector<ModelStatus> List() const ABSL_LOCKS_EXCLUDED(s_.mu) { return catalog_.List(); }
  // An admin's shadow candidate for `name` (docs/serving.md, "Shadow versions"), over its serving.json's until the
  // server restarts: a candidate, or nullopt for none. Takes effect at once for requests that name no version, and
  // the store is polled at once so that the candidate loads (with --poll-store-seconds 0, at no poll: load it
  // with the policy). NOT_FOUND for a model the repository does not serve.
  absl::Status SetShadow(const std::string& name, std::optional<ShadowSettings> shadow) ABSL_LOCKS_EXCLUDED(s_.mu) {
    return s_.SetShadow(name, shadow);
  }
  // The model's shadow candidate (serving.json's "shadow", or an admin's; docs/serving.md, "Shadow versions").
  std::optional<ShadowSettings> Shadow(const std::string& name) const ABSL_LOCKS_EXCLUDED(s_.mu) {
    return catalog_.Shadow(name);
  }
  // Every model the store holds or the repository serves, by name; a model not loaded has no versions.
  std::vector<ModelStatus> Index() const ABSL_LOCKS_EXCLUDED(s_.mu) { return catalog_.Index(); }

  // Guarantee 8 (kExplicit only; FAILED_PRECONDITION otherwise). RequestLoad: serve the model (or apply
  // what changed in its folder, when it is served already); `done` gets OK once a version is READY,
  // else why none is. NOT_FOUND when the store has no such model. RequestUnload: take every version of
  // the model out of service; `done` gets OK once none is handed out any more (they drain after).
  // `done` may run on the caller's thread (a refusal) or on a poll worker.
  void RequestLoad(const std::string& name, ControlDone done) ABSL_LOCKS_EXCLUDED(s_.mu) {
    control_.Control(name, true, LoadCause::kAdmin, std::move(done));
  }
  void RequestUnload(const std::string& name, ControlDone done) ABSL_LOCKS_EXCLUDED(s_.mu) {
    control_.Control(name, false, LoadCause::kAdmin, std::move(done));
  }
  ModelControl model_control() const { return s_.options.model_control; }
  // With load_on_demand, for a request whose Resolve() said WaitsForLoad: loads the model (one load
  // however many wait) and calls `ready` once: with the newest READY version, held for the request
  // (serve it rather than resolving again), its error, or DEADLINE_EXCEEDED at `deadline` (Env time)
  // if the load has not ended by then. RESOURCE_EXHAUSTED at once when max_waiting_loads other
  // models are loading on demand. From the caller's thread, a poll worker or the keeper.
  void WhenLoaded(const std::string& name, absl::Time deadline, LoadedDone ready) ABSL_LOCKS_EXCLUDED(s_.mu) {
    demand_.WhenLoaded(name, deadline, std::move(ready));
  }
  // The environment the versions run in: their batch queues' clock is this one's.
  const Env* env() const { return s_.env; }
  bool Has(const std::string& name) const ABSL_LOCKS_EXCLUDED(s_.mu) { return catalog_.Has(name); }
  absl::StatusOr<ModelStatus> Get(const std::string& name) const ABSL_LOCKS_EXCLUDED(s_.mu) {
    return catalog_.Get(name);
  }

  // Stops polling, abandons the loads in progress (their versions FAILED), takes every version out
  // of service and returns once each has finished the requests that hold it and is unloaded. Never
  // waits for a load. Later Resolve() calls get UNAVAILABLE. May be called from any thread, also
  // while another thread is in Poll(), and more than once, but not from two threads at once.
  void Shutdown() ABSL_LOCKS_EXCLUDED(s_.mu);

  // The loads abandoned (timed out or at Shutdown()) whose threads have not returned: "name@version
  // (running for 12s)". What a process must not wait for when it exits.
  std::vector<std::string> LoadsStillRunning() const { return loader_.StillRunning(); }

 private:
  using Record = RepositoryState::Record;
  using Entry = RepositoryState::Entry;
  using Job = RepositoryState::Job;
  using Leaving = RepositoryState::Leaving;
  using Waiter = LoadWaiters::Waiter;

  explicit ModelRepository(Options options);

  // Scans the store and queues every model not busy for the workers; returns the names queued.
  std::vector<std::string> Dispatch() ABSL_LOCKS_EXCLUDED(s_.mu);
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(s_.mu);
  // After a worker's poll of `name`: queues the controls that came while it ran (a poll of their own),
  // or frees the model for the next poll.
  void FinishJob(const std::string& name) ABSL_LOCKS_EXCLUDED(s_.mu);
  // Run by a poll worker, one worker per model name at a time (busy).
  void PollModel(const std::string& name, const StoreModel* found, LoadCause cause) ABSL_LOCKS_EXCLUDED(s_.mu);
  // READY versions whose model files on disk are no longer those they were loaded from.
  std::vector<int64_t> ChangedReadyVersions(const std::string& name, const StoreModel& found) const
      ABSL_LOCKS_EXCLUDED(s_.mu);
  // What SelectVersions needs of the model's records.
  std::map<int64_t, KnownVersion> Known(const std::string& name, const StoreModel* found) const
      ABSL_LOCKS_EXCLUDED(s_.mu);
  enum class LoadResult { kReady, kFailed, kShuttingDown };
  LoadResult Load(const std::string& name, int64_t version, const StoreModel& found, LoadCause cause)
      ABSL_LOCKS_EXCLUDED(s_.mu);
  // Guarantee 7: loads a READY version again from its changed files and swaps it in.
  LoadResult Reload(const std::string& name, int64_t version, const StoreModel& found) ABSL_LOCKS_EXCLUDED(s_.mu);
  // The lifecycle freed a servable: its record (when still UNLOADING) and its charge go.
  void Unloaded(const std::string& name, int64_t version, uint64_t generation) ABSL_LOCKS_EXCLUDED(s_.mu);

  RepositoryState s_;
  // The parts, after the state their threads touch, so that they are stopped before it goes.
  VersionLoader loader_;
  AdminControl control_;
  Catalog catalog_;
  BudgetGate budget_;
  DemandLoads demand_;
  std::thread poller_;
  std::vector<std::thread> workers_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_MODEL_REPOSITORY_H_

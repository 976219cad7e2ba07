#include "server/core/repository/model_repository.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/model/cuda_support.h"

namespace qvi {
namespace {

namespace fs = std::filesystem;

// What the lifecycle needs of the repository's options.
VersionLoader::Options LoaderOptions(const RepositoryOptions& o, const Env* env, VersionLoader::Unloaded unloaded) {
  VersionLoader::Options l;
  l.defaults = o.defaults;
  l.env = env;
  l.observer = o.observer;
  l.answers = o.answers;
  l.pipeline = o.pipeline;
  l.load_timeout = o.load_timeout;
  l.graph_backend = o.graph_backend;
  l.graph_backend_note = o.graph_backend_note;
  l.load = o.load;
  l.unloaded = std::move(unloaded);
  return l;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Create(Options options) {
  std::error_code ec;
  if (!fs::is_directory(options.root, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--model-store '", options.root, "' is not a directory"));
  }
  absl::StatusOr<c10::Device> device = ResolveDevice(options.defaults.device);
  if (!device.ok()) return device.status();
  if (options.model_control == ModelControl::kPoll && !options.load_at_start.empty()) {
    return absl::InvalidArgumentError("--load-model is for --model-control explicit; in poll mode every model loads");
  }
  if (options.unload_idle_after > absl::ZeroDuration() && options.model_control == ModelControl::kPoll &&
      !options.load_on_demand) {
    return absl::InvalidArgumentError(
        "--unload-idle-after needs --load-on-demand or --model-control explicit: in poll mode nothing else would "
        "load an idle model again");
  }
  std::unique_ptr<ModelRepository> repository(new ModelRepository(std::move(options)));
  if (absl::Status s = repository->control_.WantAtStart(); !s.ok()) return s;
  return repository;
}

ModelRepository::ModelRepository(Options options)
    : s_(std::move(options)),
      loader_(LoaderOptions(s_.options, s_.env,
                            [this](const std::string& name, int64_t version, uint64_t generation) {
                              Unloaded(name, version, generation);
                            })),
      control_(&s_),
      catalog_(&s_),
      budget_(&s_, &loader_),
      demand_(&s_, &control_) {
  demand_.Start();
  for (int i = 0; i < std::max(s_.options.load_threads, 1); ++i) {
    workers_.push_back(s_.env->StartThread("qvi-poll-worker", [this] { WorkerLoop(); }));
  }
}

void ModelRepository::Unloaded(const std::string& name, int64_t version, uint64_t generation) {
  bool gone = false;
  {
    MutexLock lock(&s_.mu);
    auto entry = s_.models.find(name);
    if (entry != s_.models.end()) {
      auto r = entry->second.versions.find(version);
      if (r != entry->second.versions.end() && r->second.generation == generation &&
          r->second.status.state == ModelState::kUnloading) {
        entry->second.versions.erase(r);
        gone = true;
      }
      if (entry->second.versions.empty()) s_.models.erase(entry);
    }
    s_.ledger.Release(generation);
    s_.room_freed.SignalAll();
  }
  if (gone) s_.Notify(name, VersionStatus{version, ModelState::kUnloaded, "unloaded", nullptr, {}});
}

void ModelRepository::StartPolling(absl::Duration interval) {
  // The first poll is due `interval` from now, not from whenever the thread gets going.
  const absl::Time first = s_.env->Now() + interval;
  poller_ = s_.env->StartThread("qvi-poller", [this, interval, first] {
    for (absl::Time due = first;; due = s_.env->Now() + interval) {
      {
        MutexLock lock(&s_.mu);
        while (!s_.stopped && !s_.poll_soon && s_.env->Now() < due) s_.env->WaitUntil(&s_.poll_wake, &s_.mu, due);
        if (s_.stopped) return;
        s_.poll_soon = false;
      }
      Dispatch();  // not waited for: a stuck load must not hold up the next poll of the others
    }
  });
}

void ModelRepository::Poll() {
  const std::vector<std::string> queued = Dispatch();
  MutexLock lock(&s_.mu);
  while (!s_.stopped) {
    bool pending = false;
    for (const std::string& name : queued) pending = pending || s_.busy.count(name) > 0;
    if (!pending) return;
    s_.jobs_changed.Wait(&s_.mu);
  }
}

std::vector<std::string> ModelRepository::Dispatch() {
  std::map<std::string, StoreModel> disk = s_.source.Scan();
  MutexLock lock(&s_.mu);
  if (s_.stopped) return {};
  std::set<std::string> names;
  s_.on_disk.clear();
  for (const auto& [name, _] : disk) {
    s_.on_disk.insert(name);
    const bool served = s_.options.model_control == ModelControl::kPoll || s_.wanted.count(name) > 0;
    if (served && s_.resting.count(name) == 0) names.insert(name);
  }
  for (const auto& [name, _] : s_.models) names.insert(name);
  std::vector<std::string> queued;
  for (const std::string& name : names) {
    // Still being polled (a load in progress, perhaps stuck): the next poll looks at it again.
    if (!s_.busy.insert(name).second) continue;
    s_.jobs.push_back(Job{name, s_.FoundLocked(name, disk), {}});
    queued.push_back(name);
  }
  s_.jobs_changed.SignalAll();
  return queued;
}

void ModelRepository::WorkerLoop() {
  while (true) {
    Job job;
    {
      MutexLock lock(&s_.mu);
      while (s_.jobs.empty() && !s_.stopped) s_.jobs_changed.Wait(&s_.mu);
      if (s_.jobs.empty()) return;
      job = std::move(s_.jobs.front());
      s_.jobs.pop_front();
      s_.turns[job.name] = s_.next_turn++;  // its loads' turn at the budget: in the order taken up
      // Unloaded for memory while its poll was queued: the poll leaves it resting, as one queued now would.
      if (job.cause == LoadCause::kPoll && s_.resting.count(job.name) > 0) job.found.reset();
    }
    PollModel(job.name, job.found ? &*job.found : nullptr, job.cause);
    {
      MutexLock lock(&s_.mu);
      s_.turns.erase(job.name);
      s_.room_freed.SignalAll();
    }
    for (const std::function<void()>& answer : job.done) answer();
    FinishJob(job.name);
  }
}

void ModelRepository::FinishJob(const std::string& name) {
  std::vector<std::function<void()>> again;
  bool stopped = false;
  {
    MutexLock lock(&s_.mu);
    auto it = s_.again.find(name);
    if (it != s_.again.end()) {
      again = std::move(it->second);
      s_.again.erase(it);
    }
    stopped = s_.stopped;
    if (again.empty() || stopped) {
      s_.busy.erase(name);
      s_.jobs_changed.SignalAll();
      s_.room_freed.SignalAll();  // a load waiting for room may unload this model now
    }
  }
  if (again.empty()) return;
  if (stopped) {  // no poll will run: each answers that the server is shutting down
    for (const std::function<void()>& answer : again) answer();
    return;
  }
  std::map<std::string, StoreModel> disk = s_.source.Scan();
  MutexLock lock(&s_.mu);
  // Queued while this worker holds no job: it takes the job itself if no other worker does first,
  // so the job runs even if Shutdown() began meanwhile (its poll then returns at once).
  LoadCause cause = LoadCause::kAdmin;
  if (auto load = s_.again_load.find(name); load != s_.again_load.end()) {
    cause = load->second;
    s_.again_load.erase(load);
    s_.WakeLocked(name);
  }
  s_.jobs.push_back(Job{name, s_.FoundLocked(name, disk), std::move(again), cause});
  s_.jobs_changed.SignalAll();
}

std::map<int64_t, KnownVersion> ModelRepository::Known(const std::string& name, const StoreModel* found) const {
  std::map<int64_t, KnownVersion> known;
  MutexLock lock(&s_.mu);
  auto entry = s_.models.find(name);
  if (entry == s_.models.end()) return known;
  for (const auto& [version, r] : entry->second.versions) {
    switch (r.status.state) {
      case ModelState::kReady:
        known[version] = KnownVersion::kReady;
        break;
      case ModelState::kFailed: {
        // The files of a version that failed are loaded again only once they change.
        bool changed = false;
        if (found != nullptr) {
          const auto stamp = found->stamps.find(version);
          changed = stamp != found->stamps.end() && stamp->second != r.stamp;
        }
        known[version] = changed ? KnownVersion::kFailedFilesChanged : KnownVersion::kFailed;
        break;
      }
      case ModelState::kLoading:  // loads happen in PollModel, which the caller is: not seen here
      case ModelState::kUnloading:
      case ModelState::kUnloaded:
        known[version] = KnownVersion::kUnloading;
        break;
    }
  }
  return known;
}

void ModelRepository::PollModel(const std::string& name, const StoreModel* found, LoadCause cause) {
  VersionPolicy policy;
  int64_t candidate = 0;  // a shadow candidate, loaded beside what the policy chooses
  {
    MutexLock lock(&s_.mu);
    if (s_.stopped) return;
    auto [entry, created] = s_.models.try_emplace(name);
    if (created) entry->second.policy = s_.options.version_policy;
    // A serving.json that cannot be read keeps the policy in force; versions loaded from now on
    // fail with its error, so the problem shows in ListModels.
    if (found != nullptr && found->overrides.ok()) {
      entry->second.policy = found->overrides->version_policy.value_or(s_.options.version_policy);
      entry->second.shadow = found->overrides->shadow;
    }
    policy = entry->second.policy;
    candidate = s_.ShadowLocked(name, entry->second);
  }
  const std::vector<int64_t> on_disk = found == nullptr ? std::vector<int64_t>{} : found->versions;

  // Rounds of loading until the policy asks for nothing more: a failed load is kFailed in the next
  // round, so latest:N reaches for the next older version. Each load ends READY or FAILED with the
  // stamp of this scan, so no version is loaded twice and the rounds end.
  VersionActions actions;
  while (true) {
    actions = SelectVersionsBeside(policy, on_disk, Known(name, found), candidate);
    if (actions.load.empty()) break;
    for (int64_t version : actions.load) {
      if (Load(name, version, *found, cause) == LoadResult::kShuttingDown) return;
    }
  }

  // READY versions whose files changed in place and that the policy keeps are loaded again.
  if (found != nullptr) {
    for (int64_t version : ChangedReadyVersions(name, *found)) {
      const bool leaving = std::any_of(actions.unload.begin(), actions.unload.end(),
                                       [&](const VersionActions::Unload& u) { return u.version == version; });
      if (!leaving && Reload(name, version, *found) == LoadResult::kShuttingDown) return;
    }
  }

  // The new versions are in service; now take out what the policy no longer wants.
  std::vector<ServableHandle> release;
  std::vector<VersionStatus> unloading;
  {
    MutexLock lock(&s_.mu);
    const bool by_admin = s_.UnloadedByAdminLocked(name, found);
    Entry& entry = s_.models[name];
    for (const VersionActions::Unload& u : actions.unload) {
      Record& r = entry.versions[u.version];
      r.status.state = ModelState::kUnloading;
      r.status.reason = by_admin ? "unloaded by an admin request" : u.reason;
      release.push_back(std::move(r.servable));
      unloading.push_back(r.status);
    }
    for (int64_t version : actions.forget) entry.versions.erase(version);
    if (entry.versions.empty()) s_.models.erase(name);
  }
  for (const VersionStatus& s : unloading) s_.Notify(name, s);
  release.clear();  // the repository's holds; each version unloads once its requests let go
}

ModelRepository::LoadResult ModelRepository::Load(const std::string& name, int64_t version, const StoreModel& found,
                                                  LoadCause cause) {
  uint64_t generation = 0;
  const VersionStatus loading{version, ModelState::kLoading, "loading", nullptr, {}};
  {
    MutexLock lock(&s_.mu);
    if (s_.stopped) return LoadResult::kShuttingDown;
    generation = s_.next_generation++;
    s_.models[name].versions[version] =
        Record{loading, nullptr, found.stamps.at(version), generation, absl::InfinitePast()};
  }
  s_.Notify(name, loading);
  absl::StatusOr<ServableHandle> servable = budget_.MakeServable(name, version, found, generation, cause);
  VersionStatus result;
  ServableHandle unused;  // loaded after Shutdown() began: let go outside the lock, never served
  std::vector<std::pair<Waiter, ServableHandle>> answered;  // the requests that waited for it
  bool stopped = false;
  {
    MutexLock lock(&s_.mu);
    stopped = s_.stopped;
    Entry& entry = s_.models[name];
    Record& r = entry.versions[version];
    if (servable.ok() && !stopped) {
      r.status = VersionStatus{
          version, ModelState::kReady, "", (*servable)->model, (*servable)->serving, s_.ledger.Charged(generation)};
      r.servable = *servable;  // from here on Resolve() hands it out
      r.loaded = s_.env->Now();
      r.servable->last_used_ns.store(absl::ToUnixNanos(r.loaded));  // a version new to the LRU is not its oldest
      s_.HandOverLocked(name, r.servable, &answered);               // before any other load may unload it
    } else {
      // A model the budget has no room for rests, unless another version of it serves.
      const bool serving = std::any_of(entry.versions.begin(), entry.versions.end(),
                                       [](const auto& v) { return v.second.status.state == ModelState::kReady; });
      if (absl::IsResourceExhausted(servable.status()) && !serving) {
        s_.resting[name] = std::string(servable.status().message());
      }
      const std::string why =
          servable.ok() ? "loaded after the server began shutting down" : std::string(servable.status().message());
      r.status = VersionStatus{version, ModelState::kFailed, why, nullptr, {}};
      if (servable.ok()) unused = *std::move(servable);
    }
    result = r.status;
  }
  unused.reset();
  s_.Notify(name, result);
  if (result.state == ModelState::kReady && s_.options.memory_event)
    s_.options.memory_event(name, true, LoadCauseName(cause));
  for (auto& [w, held] : answered) w.ready(std::move(held));
  if (stopped) return LoadResult::kShuttingDown;
  return servable.ok() ? LoadResult::kReady : LoadResult::kFailed;
}

std::vector<int64_t> ModelRepository::ChangedReadyVersions(const std::string& name, const StoreModel& found) const {
  std::vector<int64_t> changed;
  MutexLock lock(&s_.mu);
  auto entry = s_.models.find(name);
  if (entry == s_.models.end()) return changed;
  for (const auto& [version, r] : entry->second.versions) {
    if (r.status.state != ModelState::kReady) continue;
    auto stamp = found.stamps.find(version);
    if (stamp != found.stamps.end() && stamp->second.model_files != r.stamp.model_files) changed.push_back(version);
  }
  return changed;
}

ModelRepository::LoadResult ModelRepository::Reload(const std::string& name, int64_t version, const StoreModel& found) {
  uint64_t generation = 0;
  {
    MutexLock lock(&s_.mu);
    if (s_.stopped) return LoadResult::kShuttingDown;
    generation = s_.next_generation++;
  }
  absl::StatusOr<ServableHandle> servable = budget_.MakeServable(name, version, found, generation, LoadCause::kPoll);
  ServableHandle replaced;  // let go outside the lock: the servable it was drains and unloads
  std::optional<VersionStatus> ready;
  bool stopped = false;
  {
    MutexLock lock(&s_.mu);
    stopped = s_.stopped;
    auto entry = s_.models.find(name);
    Record* r = nullptr;
    if (entry != s_.models.end()) {
      auto it = entry->second.versions.find(version);
      if (it != entry->second.versions.end() && it->second.status.state == ModelState::kReady) r = &it->second;
    }
    if (stopped || r == nullptr) {
      if (servable.ok()) replaced = *std::move(servable);
    } else {
      r->stamp = found.stamps.at(version);  // these files were tried: again only once they change
      if (servable.ok()) {
        r->status = VersionStatus{
            version, ModelState::kReady, "", (*servable)->model, (*servable)->serving, s_.ledger.Charged(generation)};
        (*servable)->last_used_ns.store(r->servable->last_used_ns.load());
        replaced = std::exchange(r->servable, *servable);  // the atomic switch, as for a new version
        r->generation = generation;
        ready = r->status;
      } else {
        r->status.reason = absl::StrCat("its model files changed and did not load (", servable.status().message(),
                                        "); the files loaded before still serve");
      }
    }
  }
  replaced.reset();
  if (stopped) return LoadResult::kShuttingDown;
  if (ready) s_.Notify(name, *ready);
  if (s_.options.files_changed) s_.options.files_changed(name, version, servable.status());
  return servable.ok() ? LoadResult::kReady : LoadResult::kFailed;
}

void ModelRepository::Shutdown() {
  {
    MutexLock lock(&s_.mu);
    s_.stopped = true;
    s_.poll_wake.SignalAll();
    s_.jobs_changed.SignalAll();
    s_.room_freed.SignalAll();
  }
  demand_.Stop();  // no idle unload or deadline from here on
  // The workers wait for loads at most until these are cancelled: joining them waits for no load.
  loader_.Cancel();
  if (poller_.joinable()) poller_.join();
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  Leaving leaving;
  {
    MutexLock lock(&s_.mu);
    for (auto& [name, entry] : s_.models) {
      for (auto& [v, r] : entry.versions) {
        if (r.status.state != ModelState::kReady) continue;
        r.status.state = ModelState::kUnloading;
        r.status.reason = "the server is shutting down";
        leaving.release.push_back(std::move(r.servable));
        leaving.unloading.emplace_back(name, r.status);
      }
    }
  }
  s_.Announce(leaving);
  leaving.release.clear();  // the repository's holds; each version unloads once its requests let go
  std::map<std::string, std::vector<Waiter>> waiting;
  {
    MutexLock lock(&s_.mu);
    waiting = s_.waiters.TakeAll();
  }
  for (auto& [_, list] : waiting) {
    for (Waiter& w : list) w.ready(absl::UnavailableError("the server is shutting down"));
  }
  loader_.Stop();  // once every version is unloaded: after the requests holding them are answered
}

ModelRepository::~ModelRepository() { Shutdown(); }

}  // namespace qvi

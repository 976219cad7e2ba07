#include "server/core/repository/model_repository.h"
#include "server/core/sched/exception_text.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/alloc/allocator.h"
#include "server/core/request/request_checks.h"

namespace qvi {

namespace fs = std::filesystem;

namespace {

// What the lifecycle needs of the repository's options.
VersionLoader::Options LoaderOptions(const ModelRepository::Options& o, const Env* env,
                                     VersionLoader::Unloaded unloaded) {
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
  if (absl::Status s = repository->WantAtStart(); !s.ok()) return s;
  return repository;
}

ModelRepository::ModelRepository(Options options)
    : options_(std::move(options)),
      source_(options_.root, ModelFileNames()),
      env_(options_.env != nullptr ? options_.env : Env::Default()),
      meter_(options_.meter != nullptr ? options_.meter : &SystemMemoryMeter()),
      loader_(LoaderOptions(options_, env_, [this](const std::string& name, int64_t version, uint64_t generation) {
        Unloaded(name, version, generation);
      })) {
  if (options_.unload_idle_after > absl::ZeroDuration() || options_.load_on_demand) {
    keeper_ = std::make_unique<Keeper>(env_, [this] { return KeepOnce(); });
  }
  for (int i = 0; i < std::max(options_.load_threads, 1); ++i) {
    workers_.push_back(env_->StartThread("qvi-poll-worker", [this] { WorkerLoop(); }));
  }
}

ModelRepository::~ModelRepository() { Shutdown(); }

void ModelRepository::Notify(const std::string& name, const VersionStatus& status) const {
  if (options_.listener) options_.listener(name, status);
}

void ModelRepository::Announce(const Leaving& leaving) const {
  for (const auto& [name, status] : leaving.unloading) Notify(name, status);
}

absl::StatusOr<ServableHandle> ModelRepository::MakeServable(const std::string& name, int64_t version,
                                                             const StoreModel& found, uint64_t generation) {
  if (!found.overrides.ok()) return found.overrides.status();  // a serving.json that cannot be read
  return loader_.Load(name, version, generation, source_.VersionDir(name, version), *found.overrides);
}

void ModelRepository::Unloaded(const std::string& name, int64_t version, uint64_t generation) {
  bool gone = false;
  {
    MutexLock lock(&mu_);
    auto entry = models_.find(name);
    if (entry != models_.end()) {
      auto r = entry->second.versions.find(version);
      if (r != entry->second.versions.end() && r->second.generation == generation &&
          r->second.status.state == ModelState::kUnloading) {
        entry->second.versions.erase(r);
        gone = true;
      }
      if (entry->second.versions.empty()) models_.erase(entry);
    }
    ledger_.Release(generation);
    room_freed_.SignalAll();
  }
  if (gone) Notify(name, VersionStatus{version, ModelState::kUnloaded, "unloaded", nullptr, {}});
}

void ModelRepository::StartPolling(absl::Duration interval) {
  // The first poll is due `interval` from now, not from whenever the thread gets going.
  const absl::Time first = env_->Now() + interval;
  poller_ = env_->StartThread("qvi-poller", [this, interval, first] {
    for (absl::Time due = first;; due = env_->Now() + interval) {
      {
        MutexLock lock(&mu_);
        while (!stopped_ && env_->Now() < due) env_->WaitUntil(&poll_wake_, &mu_, due);
        if (stopped_) return;
      }
      Dispatch();  // not waited for: a stuck load must not hold up the next poll of the others
    }
  });
}

void ModelRepository::Poll() {
  const std::vector<std::string> queued = Dispatch();
  MutexLock lock(&mu_);
  while (!stopped_) {
    bool pending = false;
    for (const std::string& name : queued) pending = pending || busy_.count(name) > 0;
    if (!pending) return;
    jobs_changed_.Wait(&mu_);
  }
}

std::vector<std::string> ModelRepository::Dispatch() {
  std::map<std::string, StoreModel> disk = source_.Scan();
  MutexLock lock(&mu_);
  if (stopped_) return {};
  std::set<std::string> names;
  on_disk_.clear();
  for (const auto& [name, _] : disk) {
    on_disk_.insert(name);
    const bool served = options_.model_control == ModelControl::kPoll || wanted_.count(name) > 0;
    if (served && resting_.count(name) == 0) names.insert(name);
  }
  for (const auto& [name, _] : models_) names.insert(name);
  std::vector<std::string> queued;
  for (const std::string& name : names) {
    // Still being polled (a load in progress, perhaps stuck): the next poll looks at it again.
    if (!busy_.insert(name).second) continue;
    jobs_.push_back(Job{name, FoundLocked(name, disk), {}});
    queued.push_back(name);
  }
  jobs_changed_.SignalAll();
  return queued;
}

void ModelRepository::WorkerLoop() {
  while (true) {
    Job job;
    {
      MutexLock lock(&mu_);
      while (jobs_.empty() && !stopped_) jobs_changed_.Wait(&mu_);
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      turns_[job.name] = next_turn_++;  // its loads' turn at the budget: in the order taken up
      // Unloaded for memory while its poll was queued: the poll leaves it resting, as one queued now would.
      if (job.cause == LoadCause::kPoll && resting_.count(job.name) > 0) job.found.reset();
    }
    PollModel(job.name, job.found ? &*job.found : nullptr, job.cause);
    {
      MutexLock lock(&mu_);
      turns_.erase(job.name);
      room_freed_.SignalAll();
    }
    for (const std::function<void()>& answer : job.done) answer();
    FinishJob(job.name);
  }
}

std::map<int64_t, KnownVersion> ModelRepository::Known(const std::string& name, const StoreModel* found) const {
  std::map<int64_t, KnownVersion> known;
  MutexLock lock(&mu_);
  auto entry = models_.find(name);
  if (entry == models_.end()) return known;
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
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    auto [entry, created] = models_.try_emplace(name);
    if (created) entry->second.policy = options_.version_policy;
    // A serving.json that cannot be read keeps the policy in force; versions loaded from now on
    // fail with its error, so the problem shows in ListModels.
    if (found != nullptr && found->overrides.ok()) {
      entry->second.policy = found->overrides->version_policy.value_or(options_.version_policy);
    }
    policy = entry->second.policy;
  }
  const std::vector<int64_t> on_disk = found == nullptr ? std::vector<int64_t>{} : found->versions;

  // Rounds of loading until the policy asks for nothing more: a failed load is kFailed in the next
  // round, so latest:N reaches for the next older version. Each load ends READY or FAILED with the
  // stamp of this scan, so no version is loaded twice and the rounds end.
  VersionActions actions;
  while (true) {
    actions = SelectVersions(policy, on_disk, Known(name, found));
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
    MutexLock lock(&mu_);
    const bool by_admin = UnloadedByAdminLocked(name, found);
    Entry& entry = models_[name];
    for (const VersionActions::Unload& u : actions.unload) {
      Record& r = entry.versions[u.version];
      r.status.state = ModelState::kUnloading;
      r.status.reason = by_admin ? "unloaded by an admin request" : u.reason;
      release.push_back(std::move(r.servable));
      unloading.push_back(r.status);
    }
    for (int64_t version : actions.forget) entry.versions.erase(version);
    if (entry.versions.empty()) models_.erase(name);
  }
  for (const VersionStatus& s : unloading) Notify(name, s);
  release.clear();  // the repository's holds; each version unloads once its requests let go
}

ModelRepository::LoadResult ModelRepository::Load(const std::string& name, int64_t version, const StoreModel& found,
                                                  LoadCause cause) {
  uint64_t generation = 0;
  const VersionStatus loading{version, ModelState::kLoading, "loading", nullptr, {}};
  {
    MutexLock lock(&mu_);
    if (stopped_) return LoadResult::kShuttingDown;
    generation = next_generation_++;
    models_[name].versions[version] =
        Record{loading, nullptr, found.stamps.at(version), generation, absl::InfinitePast()};
  }
  Notify(name, loading);
  absl::StatusOr<ServableHandle> servable = MakeServableInBudget(name, version, found, generation, cause);
  VersionStatus result;
  ServableHandle unused;  // loaded after Shutdown() began: let go outside the lock, never served
  std::vector<std::pair<Waiter, ServableHandle>> answered;  // the requests that waited for it
  bool stopped = false;
  {
    MutexLock lock(&mu_);
    stopped = stopped_;
    Entry& entry = models_[name];
    Record& r = entry.versions[version];
    if (servable.ok() && !stopped) {
      r.status = VersionStatus{
          version, ModelState::kReady, "", (*servable)->model, (*servable)->serving, ledger_.Charged(generation)};
      r.servable = *servable;  // from here on Resolve() hands it out
      r.loaded = env_->Now();
      r.servable->last_used_ns.store(absl::ToUnixNanos(r.loaded));  // a version new to the LRU is not its oldest
      HandOverLocked(name, r.servable, &answered);                  // before any other load may unload it
    } else {
      // A model the budget has no room for rests, unless another version of it serves.
      const bool serving = std::any_of(entry.versions.begin(), entry.versions.end(),
                                       [](const auto& v) { return v.second.status.state == ModelState::kReady; });
      if (absl::IsResourceExhausted(servable.status()) && !serving) {
        resting_[name] = std::string(servable.status().message());
      }
      const std::string why =
          servable.ok() ? "loaded after the server began shutting down" : std::string(servable.status().message());
      r.status = VersionStatus{version, ModelState::kFailed, why, nullptr, {}};
      if (servable.ok()) unused = *std::move(servable);
    }
    result = r.status;
  }
  unused.reset();
  Notify(name, result);
  if (result.state == ModelState::kReady && options_.memory_event)
    options_.memory_event(name, true, LoadCauseName(cause));
  for (auto& [w, held] : answered) w.ready(std::move(held));
  if (stopped) return LoadResult::kShuttingDown;
  return servable.ok() ? LoadResult::kReady : LoadResult::kFailed;
}

std::vector<int64_t> ModelRepository::ChangedReadyVersions(const std::string& name, const StoreModel& found) const {
  std::vector<int64_t> changed;
  MutexLock lock(&mu_);
  auto entry = models_.find(name);
  if (entry == models_.end()) return changed;
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
    MutexLock lock(&mu_);
    if (stopped_) return LoadResult::kShuttingDown;
    generation = next_generation_++;
  }
  absl::StatusOr<ServableHandle> servable = MakeServableInBudget(name, version, found, generation, LoadCause::kPoll);
  ServableHandle replaced;  // let go outside the lock: the servable it was drains and unloads
  std::optional<VersionStatus> ready;
  bool stopped = false;
  {
    MutexLock lock(&mu_);
    stopped = stopped_;
    auto entry = models_.find(name);
    Record* r = nullptr;
    if (entry != models_.end()) {
      auto it = entry->second.versions.find(version);
      if (it != entry->second.versions.end() && it->second.status.state == ModelState::kReady) r = &it->second;
    }
    if (stopped || r == nullptr) {
      if (servable.ok()) replaced = *std::move(servable);
    } else {
      r->stamp = found.stamps.at(version);  // these files were tried: again only once they change
      if (servable.ok()) {
        r->status = VersionStatus{
            version, ModelState::kReady, "", (*servable)->model, (*servable)->serving, ledger_.Charged(generation)};
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
  if (ready) Notify(name, *ready);
  if (options_.files_changed) options_.files_changed(name, version, servable.status());
  return servable.ok() ? LoadResult::kReady : LoadResult::kFailed;
}

void ModelRepository::Shutdown() {
  {
    MutexLock lock(&mu_);
    stopped_ = true;
    poll_wake_.SignalAll();
    jobs_changed_.SignalAll();
    room_freed_.SignalAll();
  }
  if (keeper_ != nullptr) keeper_->Stop();  // no idle unload or deadline from here on
  // The workers wait for loads at most until these are cancelled: joining them waits for no load.
  loader_.Cancel();
  if (poller_.joinable()) poller_.join();
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  Leaving leaving;
  {
    MutexLock lock(&mu_);
    for (auto& [name, entry] : models_) {
      for (auto& [v, r] : entry.versions) {
        if (r.status.state != ModelState::kReady) continue;
        r.status.state = ModelState::kUnloading;
        r.status.reason = "the server is shutting down";
        leaving.release.push_back(std::move(r.servable));
        leaving.unloading.emplace_back(name, r.status);
      }
    }
  }
  Announce(leaving);
  leaving.release.clear();  // the repository's holds; each version unloads once its requests let go
  std::map<std::string, std::vector<Waiter>> waiting;
  {
    MutexLock lock(&mu_);
    waiting = waiters_.TakeAll();
  }
  for (auto& [_, list] : waiting) {
    for (Waiter& w : list) w.ready(absl::UnavailableError("the server is shutting down"));
  }
  loader_.Stop();  // once every version is unloaded: after the requests holding them are answered
}

}  // namespace qvi

// ModelRepository's loads and unloads: a version read and warmed up with a deadline on a thread of
// its own (MakeServable, LoadModel), the loads cancelled or waited for at shutdown, and the unloader
// that lets a retired version go once its last request has its answer. The repository's polling,
// resolution and listing: model_repository.cc.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/alloc/allocator.h"
#include "server/core/sched/exception_text.h"
#include "server/core/serving/model_repository.h"

namespace qvi {

namespace fs = std::filesystem;

// One load on a thread of its own, shared by that thread, the poll worker waiting for it and
// loads_; whoever lets go last frees it.
struct ModelRepository::LoadAttempt {
  LoadAttempt(std::string what, absl::Time started) : what(std::move(what)), started(started) {}
  const std::string what;  // "name@version"
  const absl::Time started;
  Mutex mu;
  CondVar finished_cv;  // finished, or cancelled by Shutdown()
  bool finished ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  bool abandoned ABSL_GUARDED_BY(mu) = false;  // nobody waits for the result: the thread frees it
  absl::StatusOr<LoadedModel> result ABSL_GUARDED_BY(mu);
};

absl::StatusOr<ServableHandle> ModelRepository::MakeServable(const std::string& name, int64_t version,
                                                             const StoreModel& found, uint64_t generation) {
  if (!found.overrides.ok()) return found.overrides.status();  // a serving.json that cannot be read
  absl::StatusOr<LoadedModel> loaded =
      LoadModel(absl::StrCat(name, "@", version), source_.VersionDir(name, version), *found.overrides);
  if (!loaded.ok()) return loaded.status();
  if (loaded->model->manifest().name != name) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.json names the model '", loaded->model->manifest().name,
                                                   "' but it sits in the folder '", name, "'"));
  }
  std::shared_ptr<const Model> model(std::move(loaded->model));
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = ModelRunner::Create(
      model, version, loaded->serving, env_, options_.observer, options_.answers, options_.pipeline);
  if (!runner.ok()) return runner.status();
  auto* servable = new Servable{name, version, generation, model, std::move(loaded->serving), *std::move(runner)};
  {
    MutexLock lock(&retire_mu_);
    ++live_servables_;
  }
  return ServableHandle(servable, [this, generation](Servable* s) { Retire(s, generation); });
}

absl::StatusOr<ModelRepository::LoadedModel> ModelRepository::LoadModel(const std::string& what,
                                                                        const std::string& path,
                                                                        const ServingOverrides& overrides) {
  // Before the thread starts: the load's time counts from here, whatever the clock does meanwhile.
  auto attempt = std::make_shared<LoadAttempt>(what, env_->Now());
  const absl::Time until = attempt->started + options_.load_timeout;
  {
    MutexLock lock(&loads_mu_);
    if (loads_cancelled_) return absl::CancelledError("not loaded: the server is shutting down");
    // Forget the loads that have returned; the abandoned ones still running stay listed.
    loads_.erase(std::remove_if(loads_.begin(), loads_.end(),
                                [](const std::shared_ptr<LoadAttempt>& a) {
                                  MutexLock l(&a->mu);
                                  return a->finished;
                                }),
                 loads_.end());
    loads_.push_back(attempt);
  }
  auto load =
      options_.load ? options_.load : [](const std::string& p, const LoadOptions& o) { return Model::Load(p, o); };
  env_->StartThread(
          "qvi-load",
          [attempt, load = std::move(load), path, defaults = options_.defaults, overrides,
           backend = options_.graph_backend, note = options_.graph_backend_note, env = env_] {
            absl::StatusOr<LoadedModel> result;
            try {
              result = [&]() -> absl::StatusOr<LoadedModel> {
                absl::StatusOr<std::unique_ptr<Model>> model = load(path, ResolvePlacement(defaults, overrides));
                if (!model.ok()) return model.status();
                ServingConfig serving =
                    ResolveServingConfig(defaults, (*model)->manifest(), overrides, (*model)->torch_device().is_cuda());
                if (absl::Status s = (*model)->PrepareGraphs(serving, backend, note, env); !s.ok()) return s;
                return LoadedModel{*std::move(model), std::move(serving)};
              }();
            } catch (...) {
              result = absl::InternalError(absl::StrCat("loading ", path, " failed: ", CurrentExceptionText()));
            }
            absl::StatusOr<LoadedModel> late;  // nobody waits for it: freed here, on this thread
            {
              MutexLock lock(&attempt->mu);
              (attempt->abandoned ? late : attempt->result) = std::move(result);
              attempt->finished = true;
              attempt->finished_cv.SignalAll();
            }
          })
      .detach();
  MutexLock lock(&attempt->mu);
  while (!attempt->finished && !attempt->cancelled && env_->Now() < until) {
    env_->WaitUntil(&attempt->finished_cv, &attempt->mu, until);
  }
  if (attempt->finished) return std::move(attempt->result);
  attempt->abandoned = true;
  if (attempt->cancelled) {
    return absl::CancelledError(absl::StrCat("loading abandoned: the server is shutting down (it had run for ",
                                             RunningFor(*attempt, env_->Now()), ")"));
  }
  return absl::DeadlineExceededError(absl::StrCat("loading and warming up did not finish within ",
                                                  absl::FormatDuration(options_.load_timeout),
                                                  " (--model-load-timeout-seconds); abandoned"));
}

std::string ModelRepository::RunningFor(const LoadAttempt& attempt, absl::Time now) {
  return absl::StrCat(absl::ToInt64Seconds(now - attempt.started), " s");
}

void ModelRepository::CancelLoads() {
  MutexLock lock(&loads_mu_);
  loads_cancelled_ = true;
  for (const std::shared_ptr<LoadAttempt>& a : loads_) {
    MutexLock l(&a->mu);
    a->cancelled = true;
    a->finished_cv.SignalAll();
  }
}

std::vector<std::string> ModelRepository::LoadsStillRunning() const {
  std::vector<std::string> running;
  MutexLock lock(&loads_mu_);
  for (const std::shared_ptr<LoadAttempt>& a : loads_) {
    MutexLock l(&a->mu);
    if (a->finished) continue;
    running.push_back(absl::StrCat(a->what, " (running for ", RunningFor(*a, env_->Now()), ")"));
  }
  return running;
}

void ModelRepository::Retire(Servable* servable, uint64_t generation) {
  // Runs wherever the last hold was let go, often a model instance thread of this very servable,
  // which must not join itself: the unloader thread does the stopping.
  MutexLock lock(&retire_mu_);
  retiring_.emplace_back(servable, generation);
  retire_changed_.SignalAll();
}

void ModelRepository::UnloaderLoop() {
  while (true) {
    std::pair<Servable*, uint64_t> item;
    {
      MutexLock lock(&retire_mu_);
      while (retiring_.empty() && !unloader_stopping_) retire_changed_.Wait(&retire_mu_);
      if (retiring_.empty()) return;
      item = retiring_.front();
      retiring_.erase(retiring_.begin());
    }
    const std::string name = item.first->name;
    const int64_t version = item.first->version;
    delete item.first;  // stops its (now idle) batch queue and instance threads, frees the model
    // Hand what the version freed back to the system: its instance threads' malloc arenas would
    // otherwise keep it, and a server that rolls out often would grow by it each time.
    ReleaseFreeMemory();
    bool gone = false;
    {
      MutexLock lock(&mu_);
      auto entry = models_.find(name);
      if (entry != models_.end()) {
        auto r = entry->second.versions.find(version);
        if (r != entry->second.versions.end() && r->second.generation == item.second &&
            r->second.status.state == ModelState::kUnloading) {
          entry->second.versions.erase(r);
          gone = true;
        }
        if (entry->second.versions.empty()) models_.erase(entry);
      }
      charges_.erase(item.second);
      room_freed_.SignalAll();
    }
    {
      MutexLock lock(&retire_mu_);
      --live_servables_;
      retire_changed_.SignalAll();
    }
    if (gone) Notify(name, VersionStatus{version, ModelState::kUnloaded, "unloaded", nullptr, {}});
  }
}

}  // namespace qvi

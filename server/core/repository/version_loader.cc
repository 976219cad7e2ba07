#include "server/core/repository/version_loader.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/alloc/allocator.h"
#include "server/core/base/exception_text.h"

namespace qvi {

// One load on a thread of its own, shared by that thread, the Load() waiting for it and loads_; whoever
// lets go last frees it.
struct VersionLoader::Attempt {
  Attempt(std::string what, absl::Time started) : what(std::move(what)), started(started) {}
  const std::string what;  // "name@version"
  const absl::Time started;
  Mutex mu;
  CondVar finished_cv;  // finished, or cancelled
  bool finished ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  bool abandoned ABSL_GUARDED_BY(mu) = false;  // nobody waits for the result: the thread frees it
  absl::StatusOr<Loaded> result ABSL_GUARDED_BY(mu);
};

VersionLoader::VersionLoader(Options options)
    : options_(std::move(options)), env_(options_.env != nullptr ? options_.env : Env::Default()) {
  unloader_ = env_->StartThread("qvi-unloader", [this] { UnloaderLoop(); });
}

VersionLoader::~VersionLoader() {
  Cancel();
  Stop();
}

absl::StatusOr<ServableHandle> VersionLoader::Load(const std::string& name, int64_t version, uint64_t generation,
                                                   const std::string& dir, const ServingOverrides& overrides) {
  absl::StatusOr<Loaded> loaded = Run(absl::StrCat(name, "@", version), dir, overrides);
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
    ++live_;
  }
  return ServableHandle(servable, [this](Servable* s) { Retire(s); });
}

absl::StatusOr<VersionLoader::Loaded> VersionLoader::Run(const std::string& what, const std::string& dir,
                                                         const ServingOverrides& overrides) {
  // Before the thread starts: the load's time counts from here, whatever the clock does meanwhile.
  auto attempt = std::make_shared<Attempt>(what, env_->Now());
  const absl::Time until = attempt->started + options_.load_timeout;
  {
    MutexLock lock(&loads_mu_);
    if (cancelled_) return absl::CancelledError("not loaded: the server is shutting down");
    // Forget the loads that have returned; the abandoned ones still running stay listed.
    loads_.erase(std::remove_if(loads_.begin(), loads_.end(),
                                [](const std::shared_ptr<Attempt>& a) {
                                  MutexLock l(&a->mu);
                                  return a->finished;
                                }),
                 loads_.end());
    loads_.push_back(attempt);
  }
  LoadFn load =
      options_.load ? options_.load : [](const std::string& p, const LoadOptions& o) { return Model::Load(p, o); };
  env_->StartThread(
          "qvi-load",
          [attempt, load = std::move(load), dir, defaults = options_.defaults, overrides,
           backend = options_.graph_backend, note = options_.graph_backend_note, env = env_] {
            absl::StatusOr<Loaded> result;
            try {
              result = [&]() -> absl::StatusOr<Loaded> {
                absl::StatusOr<std::unique_ptr<Model>> model = load(dir, ResolvePlacement(defaults, overrides));
                if (!model.ok()) return model.status();
                ServingConfig serving =
                    ResolveServingConfig(defaults, (*model)->manifest(), overrides, (*model)->torch_device().is_cuda());
                if (absl::Status s = CheckServingFor(serving, (*model)->manifest()); !s.ok()) return s;
                if (absl::Status s = (*model)->PrepareGraphs(serving, backend, note, env); !s.ok()) return s;
                return Loaded{*std::move(model), std::move(serving)};
              }();
            } catch (...) {
              result = absl::InternalError(absl::StrCat("loading ", dir, " failed: ", CurrentExceptionText()));
            }
            absl::StatusOr<Loaded> late;  // nobody waits for it: freed here, on this thread
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

std::string VersionLoader::RunningFor(const Attempt& attempt, absl::Time now) {
  return absl::StrCat(absl::ToInt64Seconds(now - attempt.started), " s");
}

void VersionLoader::Cancel() {
  MutexLock lock(&loads_mu_);
  cancelled_ = true;
  for (const std::shared_ptr<Attempt>& a : loads_) {
    MutexLock l(&a->mu);
    a->cancelled = true;
    a->finished_cv.SignalAll();
  }
}

std::vector<std::string> VersionLoader::StillRunning() const {
  std::vector<std::string> running;
  MutexLock lock(&loads_mu_);
  for (const std::shared_ptr<Attempt>& a : loads_) {
    MutexLock l(&a->mu);
    if (a->finished) continue;
    running.push_back(absl::StrCat(a->what, " (running for ", RunningFor(*a, env_->Now()), ")"));
  }
  return running;
}

void VersionLoader::Retire(Servable* servable) {
  // Runs wherever the last hold was let go, often a model instance thread of this very servable,
  // which must not join itself: the unloader thread does the stopping.
  MutexLock lock(&retire_mu_);
  retiring_.push_back(servable);
  retire_changed_.SignalAll();
}

void VersionLoader::UnloaderLoop() {
  while (true) {
    Servable* servable = nullptr;
    {
      MutexLock lock(&retire_mu_);
      while (retiring_.empty() && !stopping_) retire_changed_.Wait(&retire_mu_);
      if (retiring_.empty()) return;
      servable = retiring_.front();
      retiring_.erase(retiring_.begin());
    }
    const std::string name = servable->name;
    const int64_t version = servable->version;
    const uint64_t generation = servable->generation;
    delete servable;  // stops its (now idle) batch queue and instance threads, frees the model
    // Hand what the version freed back to the system: its instance threads' malloc arenas would
    // otherwise keep it, and a server that rolls out often would grow by it each time.
    ReleaseFreeMemory();
    if (options_.unloaded) options_.unloaded(name, version, generation);
    MutexLock lock(&retire_mu_);
    --live_;
    retire_changed_.SignalAll();
  }
}

void VersionLoader::Stop() {
  {
    MutexLock lock(&retire_mu_);
    while (live_ > 0) retire_changed_.Wait(&retire_mu_);
    stopping_ = true;
    retire_changed_.SignalAll();
  }
  if (unloader_.joinable()) unloader_.join();
}

}  // namespace qvi

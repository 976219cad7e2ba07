// Model control (guarantee 8 of model_repository.h): which models are served when the server's
// model control is explicit, the loads and unloads asked for over the wire, and the store's index;
// and what a request or a listing is told of the models (Resolve, List).
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request_checks.h"

namespace qvi {
namespace {

std::string Holds(const std::set<std::string>& names) { return names.empty() ? "(none)" : absl::StrJoin(names, ", "); }

absl::Status UnknownModel(const std::string& name, const std::vector<std::string>& names) {
  return absl::NotFoundError(absl::StrCat(
      "model '", Capped(name), "' not found; models: ", names.empty() ? "(none)" : absl::StrJoin(names, ", ")));
}

}  // namespace

absl::Status ModelRepository::NotLoaded(const std::string& name) {
  return absl::UnavailableError(absl::StrCat("model '", Capped(name),
                                             "' is not loaded: the server's model control is explicit, and an admin "
                                             "loads it (OIP RepositoryModelLoad, POST /v2/repository/models/",
                                             Capped(name), "/load)"));
}

absl::Status ModelRepository::WantAtStart() {
  if (options_.load_at_start.empty()) return absl::OkStatus();
  std::map<std::string, StoreModel> disk = source_.Scan();
  MutexLock lock(&mu_);
  for (const auto& [name, _] : disk) on_disk_.insert(name);
  for (const std::string& name : options_.load_at_start) {
    if (name == "*") {
      wanted_.insert(on_disk_.begin(), on_disk_.end());
    } else if (on_disk_.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--load-model '", Capped(name), "': the model store ",
                                                     options_.root, " has no such model; it holds: ", Holds(on_disk_)));
    } else {
      wanted_.insert(name);
    }
  }
  return absl::OkStatus();
}

std::optional<StoreModel> ModelRepository::FoundLocked(const std::string& name,
                                                       std::map<std::string, StoreModel>& disk) const {
  if (options_.model_control == ModelControl::kExplicit && wanted_.count(name) == 0) return std::nullopt;
  if (resting_.count(name) > 0) return std::nullopt;  // unloaded to save memory: loaded again when asked
  auto it = disk.find(name);
  if (it == disk.end()) return std::nullopt;
  return std::move(it->second);
}

bool ModelRepository::UnloadedByAdminLocked(const std::string& name, const StoreModel* found) const {
  return found == nullptr && on_disk_.count(name) > 0 && resting_.count(name) == 0 &&
         options_.model_control == ModelControl::kExplicit && wanted_.count(name) == 0;
}

void ModelRepository::RequestLoad(const std::string& name, ControlDone done) {
  Control(name, true, LoadCause::kAdmin, std::move(done));
}

void ModelRepository::RequestUnload(const std::string& name, ControlDone done) {
  Control(name, false, LoadCause::kAdmin, std::move(done));
}

void ModelRepository::Control(const std::string& name, bool load, LoadCause cause, ControlDone done) {
  if (options_.model_control != ModelControl::kExplicit && cause == LoadCause::kAdmin) {
    done(absl::FailedPreconditionError(
        "the server's model control is 'poll': it serves every model of its store, loaded and unloaded as their "
        "folders come and go; start it with --model-control explicit to load and unload models over the wire"));
    return;
  }
  std::map<std::string, StoreModel> disk = source_.Scan();
  absl::Status refused;
  {
    MutexLock lock(&mu_);
    on_disk_.clear();
    for (const auto& [n, _] : disk) on_disk_.insert(n);
    if (stopped_) {
      refused = absl::UnavailableError("the server is shutting down");
    } else if (disk.count(name) == 0 && (load || models_.count(name) == 0)) {
      refused =
          absl::NotFoundError(absl::StrCat("model '", Capped(name), "' is not in the model store ", options_.root,
                                           load ? "" : " and not served", "; the store holds: ", Holds(on_disk_)));
    } else {
      if (load) {
        wanted_.insert(name);
      } else {
        wanted_.erase(name);
      }
      WakeLocked(name);
      std::function<void()> answer = [this, name, load, done = std::move(done)] { done(ControlResult(name, load)); };
      if (!busy_.insert(name).second) {
        again_[name].push_back(std::move(answer));  // after the poll of it in progress, a poll of its own
        if (load) {  // which wakes the model again (that poll may rest it); an admin's wait, not the requests'
          auto [it, first] = again_load_.try_emplace(name, cause);
          if (!first && cause == LoadCause::kAdmin) it->second = cause;
        }
      } else {
        jobs_.push_back(Job{name, FoundLocked(name, disk), {}, cause});
        jobs_.back().done.push_back(std::move(answer));
        jobs_changed_.SignalAll();
      }
      return;
    }
  }
  done(refused);
}

void ModelRepository::WakeLocked(const std::string& name) {
  // A resting model has no READY version; the budget's refusals (FAILED) are tried again now.
  if (resting_.erase(name) == 0 || models_.count(name) == 0) return;
  std::map<int64_t, Record>& versions = models_[name].versions;
  for (auto v = versions.begin(); v != versions.end();) {
    v = v->second.status.state == ModelState::kFailed ? versions.erase(v) : std::next(v);
  }
  if (versions.empty()) models_.erase(name);
}

void ModelRepository::FinishJob(const std::string& name) {
  std::vector<std::function<void()>> again;
  bool stopped = false;
  {
    MutexLock lock(&mu_);
    auto it = again_.find(name);
    if (it != again_.end()) {
      again = std::move(it->second);
      again_.erase(it);
    }
    stopped = stopped_;
    if (again.empty() || stopped) {
      busy_.erase(name);
      jobs_changed_.SignalAll();
      room_freed_.SignalAll();  // a load waiting for room may unload this model now
    }
  }
  if (again.empty()) return;
  if (stopped) {  // no poll will run: each answers that the server is shutting down
    for (const std::function<void()>& answer : again) answer();
    return;
  }
  std::map<std::string, StoreModel> disk = source_.Scan();
  MutexLock lock(&mu_);
  // Queued while this worker holds no job: it takes the job itself if no other worker does first,
  // so the job runs even if Shutdown() began meanwhile (its poll then returns at once).
  LoadCause cause = LoadCause::kAdmin;
  if (auto load = again_load_.find(name); load != again_load_.end()) {
    cause = load->second;
    again_load_.erase(load);
    WakeLocked(name);
  }
  jobs_.push_back(Job{name, FoundLocked(name, disk), std::move(again), cause});
  jobs_changed_.SignalAll();
}

absl::Status ModelRepository::ControlResult(const std::string& name, bool load) const {
  MutexLock lock(&mu_);
  if (stopped_) return absl::UnavailableError("the server is shutting down");
  if (!load) return absl::OkStatus();
  auto it = models_.find(name);
  std::vector<std::string> why;
  if (it != models_.end()) {
    for (const auto& [version, r] : it->second.versions) {
      if (r.status.state == ModelState::kReady) return absl::OkStatus();
      why.push_back(absl::StrCat("version ", version, " ", ModelStateName(r.status.state), ": ", r.status.reason));
    }
  }
  if (auto rest = resting_.find(name); rest != resting_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat("model '", Capped(name), "' did not load: ", rest->second));
  }
  if (wanted_.count(name) == 0 && options_.model_control == ModelControl::kExplicit) {
    why.push_back("it was unloaded meanwhile");
  }
  return absl::FailedPreconditionError(
      absl::StrCat("model '", Capped(name), "' did not load: ",
                   why.empty() ? "its version policy chose no version of the store's" : absl::StrJoin(why, "; ")));
}

std::vector<ModelStatus> ModelRepository::Index() const {
  std::map<std::string, StoreModel> disk = source_.Scan();
  std::map<std::string, ModelStatus> all;
  for (ModelStatus& m : List()) all.emplace(m.name, std::move(m));
  for (const auto& [name, _] : disk) all.try_emplace(name, ModelStatus{name, "", {}, ""});
  MutexLock lock(&mu_);
  for (auto& [name, m] : all) {
    auto rest = resting_.find(name);
    if (m.versions.empty()) m.not_loaded = rest != resting_.end() ? rest->second : "not loaded";
  }
  std::vector<ModelStatus> out;
  for (auto& [_, m] : all) out.push_back(std::move(m));
  return out;
}

ServableHandle ModelRepository::Used(const ServableHandle& servable) const {
  servable->last_used_ns.store(absl::ToUnixNanos(env_->Now()), std::memory_order_relaxed);
  return servable;
}

absl::Status ModelRepository::NotServedLocked(const std::string& name) const {
  auto it = models_.find(name);
  auto rest = resting_.find(name);
  const bool not_loaded = (it == models_.end() || rest != resting_.end()) && on_disk_.count(name) > 0 &&
                          (rest != resting_.end() || options_.model_control == ModelControl::kExplicit);
  if (not_loaded && options_.load_on_demand) return LoadsOnDemand(name);
  if (not_loaded && rest != resting_.end()) {
    return absl::UnavailableError(absl::StrCat("model '", Capped(name), "' is not loaded: ", rest->second,
                                               "; a request loads it again with --load-on-demand, or an admin does "
                                               "(POST /v2/repository/models/",
                                               Capped(name), "/load)"));
  }
  if (not_loaded) return NotLoaded(name);
  if (it != models_.end()) return absl::OkStatus();
  if (options_.load_on_demand && busy_.count(name) > 0 && on_disk_.count(name) > 0) return LoadsOnDemand(name);
  std::vector<std::string> names;
  for (const auto& [n, _] : models_) names.push_back(n);
  return UnknownModel(name, names);
}

absl::StatusOr<ServableHandle> ModelRepository::Resolve(const std::string& name, int64_t version) const {
  MutexLock lock(&mu_);
  if (stopped_) return absl::UnavailableError("the server is shutting down");
  if (absl::Status missing = NotServedLocked(name); !missing.ok()) return missing;
  auto it = models_.find(name);
  // A load (on demand, or a poll's) is under way: the request waits for it rather than be refused.
  const bool wait = options_.load_on_demand && busy_.count(name) > 0;
  const std::map<int64_t, Record>& versions = it->second.versions;
  if (version == 0) {
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
      if (v->second.status.state == ModelState::kReady) return Used(v->second.servable);
    }
    if (wait) return LoadsOnDemand(name);
    std::vector<std::string> why;
    for (const auto& [n, r] : versions) {
      why.push_back(absl::StrCat(n, " ", ModelStateName(r.status.state), ": ", r.status.reason));
    }
    return absl::UnavailableError(
        absl::StrCat("model '", name, "' has no ready version (", absl::StrJoin(why, "; "), ")"));
  }
  auto v = versions.find(version);
  if (v == versions.end() && wait) return LoadsOnDemand(name);
  if (v == versions.end()) {
    std::vector<int64_t> numbers;
    for (const auto& [n, _] : versions) numbers.push_back(n);
    return absl::NotFoundError(absl::StrCat("model '", name, "' has no version ", version,
                                            "; versions: ", absl::StrJoin(numbers, ", "), " (version policy ",
                                            it->second.policy.ToString(), ")"));
  }
  if (v->second.status.state != ModelState::kReady) {
    if (wait) return LoadsOnDemand(name);
    return absl::UnavailableError(absl::StrCat("model '", name, "' version ", version, " is ",
                                               ModelStateName(v->second.status.state), ": ", v->second.status.reason));
  }
  return Used(v->second.servable);
}

std::vector<ModelStatus> ModelRepository::List() const {
  MutexLock lock(&mu_);
  std::vector<ModelStatus> out;
  for (const auto& [name, entry] : models_) {
    ModelStatus m{name, entry.policy.ToString(), {}, ""};
    for (auto v = entry.versions.rbegin(); v != entry.versions.rend(); ++v) m.versions.push_back(v->second.status);
    out.push_back(std::move(m));
  }
  return out;
}

bool ModelRepository::Has(const std::string& name) const {
  MutexLock lock(&mu_);
  return models_.count(name) > 0;
}

absl::StatusOr<ModelStatus> ModelRepository::Get(const std::string& name) const {
  std::vector<std::string> names;
  for (ModelStatus& m : List()) {
    if (m.name == name) return std::move(m);
    names.push_back(m.name);
  }
  return UnknownModel(name, names);
}

}  // namespace qvi

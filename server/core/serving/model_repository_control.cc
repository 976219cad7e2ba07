// Model control (guarantee 8 of model_repository.h): which models are served when the server's
// model control is explicit, the loads and unloads asked for over the wire, and the store's index.
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/request/request_checks.h"
#include "server/core/serving/model_repository.h"

namespace qvi {
namespace {

std::string Holds(const std::set<std::string>& names) { return names.empty() ? "(none)" : absl::StrJoin(names, ", "); }

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
  auto it = disk.find(name);
  if (it == disk.end()) return std::nullopt;
  return std::move(it->second);
}

void ModelRepository::RequestLoad(const std::string& name, ControlDone done) { Control(name, true, std::move(done)); }

void ModelRepository::RequestUnload(const std::string& name, ControlDone done) {
  Control(name, false, std::move(done));
}

void ModelRepository::Control(const std::string& name, bool load, ControlDone done) {
  if (options_.model_control != ModelControl::kExplicit) {
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
      std::function<void()> answer = [this, name, load, done = std::move(done)] { done(ControlResult(name, load)); };
      if (!busy_.insert(name).second) {
        again_[name].push_back(std::move(answer));  // after the poll of it in progress, a poll of its own
      } else {
        jobs_.push_back(Job{name, FoundLocked(name, disk), {}});
        jobs_.back().done.push_back(std::move(answer));
        jobs_changed_.SignalAll();
      }
      return;
    }
  }
  done(refused);
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
  jobs_.push_back(Job{name, FoundLocked(name, disk), std::move(again)});
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
  if (wanted_.count(name) == 0) why.push_back("it was unloaded meanwhile");
  return absl::FailedPreconditionError(
      absl::StrCat("model '", Capped(name), "' did not load: ",
                   why.empty() ? "its version policy chose no version of the store's" : absl::StrJoin(why, "; ")));
}

std::vector<ModelStatus> ModelRepository::Index() const {
  std::map<std::string, StoreModel> disk = source_.Scan();
  std::map<std::string, ModelStatus> all;
  for (ModelStatus& m : List()) all.emplace(m.name, std::move(m));
  for (const auto& [name, _] : disk) all.try_emplace(name, ModelStatus{name, "", {}});
  std::vector<ModelStatus> out;
  for (auto& [_, m] : all) out.push_back(std::move(m));
  return out;
}

}  // namespace qvi

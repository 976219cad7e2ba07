#include "server/core/repository/admin_control.h"

#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/request/request_checks.h"

namespace qvi {
namespace {

std::string Holds(const std::set<std::string>& names) { return names.empty() ? "(none)" : absl::StrJoin(names, ", "); }

}  // namespace

absl::Status AdminControl::WantAtStart() {
  if (s_.options.load_at_start.empty()) return absl::OkStatus();
  std::map<std::string, StoreModel> disk = s_.source.Scan();
  MutexLock lock(&s_.mu);
  for (const auto& [name, _] : disk) s_.on_disk.insert(name);
  for (const std::string& name : s_.options.load_at_start) {
    if (name == "*") {
      s_.wanted.insert(s_.on_disk.begin(), s_.on_disk.end());
    } else if (s_.on_disk.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--load-model '", Capped(name), "': the model store ",
                                                     s_.options.root,
                                                     " has no such model; it holds: ", Holds(s_.on_disk)));
    } else {
      s_.wanted.insert(name);
    }
  }
  return absl::OkStatus();
}

void AdminControl::Control(const std::string& name, bool load, LoadCause cause, ControlDone done) {
  if (s_.options.model_control != ModelControl::kExplicit && cause == LoadCause::kAdmin) {
    done(absl::FailedPreconditionError(
        "the server's model control is 'poll': it serves every model of its store, loaded and unloaded as their "
        "folders come and go; start it with --model-control explicit to load and unload models over the wire"));
    return;
  }
  std::map<std::string, StoreModel> disk = s_.source.Scan();
  absl::Status refused;
  {
    MutexLock lock(&s_.mu);
    s_.on_disk.clear();
    for (const auto& [n, _] : disk) s_.on_disk.insert(n);
    if (s_.stopped) {
      refused = absl::UnavailableError("the server is shutting down");
    } else if (disk.count(name) == 0 && (load || s_.models.count(name) == 0)) {
      refused =
          absl::NotFoundError(absl::StrCat("model '", Capped(name), "' is not in the model store ", s_.options.root,
                                           load ? "" : " and not served", "; the store holds: ", Holds(s_.on_disk)));
    } else {
      if (load) {
        s_.wanted.insert(name);
      } else {
        s_.wanted.erase(name);
      }
      s_.WakeLocked(name);
      std::function<void()> answer = [this, name, load, done = std::move(done)] { done(ControlResult(name, load)); };
      if (!s_.busy.insert(name).second) {
        s_.again[name].push_back(std::move(answer));  // after the poll of it in progress, a poll of its own
        if (load) {  // which wakes the model again (that poll may rest it); an admin's wait, not the requests'
          auto [it, first] = s_.again_load.try_emplace(name, cause);
          if (!first && cause == LoadCause::kAdmin) it->second = cause;
        }
      } else {
        s_.jobs.push_back(Job{name, s_.FoundLocked(name, disk), {}, cause});
        s_.jobs.back().done.push_back(std::move(answer));
        s_.jobs_changed.SignalAll();
      }
      return;
    }
  }
  done(refused);
}

absl::Status AdminControl::ControlResult(const std::string& name, bool load) const {
  MutexLock lock(&s_.mu);
  if (s_.stopped) return absl::UnavailableError("the server is shutting down");
  if (!load) return absl::OkStatus();
  auto it = s_.models.find(name);
  std::vector<std::string> why;
  if (it != s_.models.end()) {
    for (const auto& [version, r] : it->second.versions) {
      if (r.status.state == ModelState::kReady) return absl::OkStatus();
      why.push_back(absl::StrCat("version ", version, " ", ModelStateName(r.status.state), ": ", r.status.reason));
    }
  }
  if (auto rest = s_.resting.find(name); rest != s_.resting.end()) {
    return absl::ResourceExhaustedError(absl::StrCat("model '", Capped(name), "' did not load: ", rest->second));
  }
  if (s_.wanted.count(name) == 0 && s_.options.model_control == ModelControl::kExplicit) {
    why.push_back("it was unloaded meanwhile");
  }
  return absl::FailedPreconditionError(
      absl::StrCat("model '", Capped(name), "' did not load: ",
                   why.empty() ? "its version policy chose no version of the store's" : absl::StrJoin(why, "; ")));
}

}  // namespace qvi

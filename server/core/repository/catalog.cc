#include "server/core/repository/catalog.h"

#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/request/request_checks.h"

namespace qvi {
namespace {

constexpr char kWaitsForLoad[] = "type.qvi.dev/waits-for-load";

absl::Status UnknownModel(const std::string& name, const std::vector<std::string>& names) {
  return absl::NotFoundError(absl::StrCat(
      "model '", Capped(name), "' not found; models: ", names.empty() ? "(none)" : absl::StrJoin(names, ", ")));
}

}  // namespace

bool WaitsForLoad(const absl::Status& status) { return status.GetPayload(kWaitsForLoad).has_value(); }

absl::Status Catalog::NotLoaded(const std::string& name) {
  return absl::UnavailableError(absl::StrCat("model '", Capped(name),
                                             "' is not loaded: the server's model control is explicit, and an admin "
                                             "loads it (OIP RepositoryModelLoad, POST /v2/repository/models/",
                                             Capped(name), "/load)"));
}

absl::Status Catalog::LoadsOnDemand(const std::string& name) {
  absl::Status status = absl::UnavailableError(
      absl::StrCat("model '", Capped(name), "' is not loaded; it loads on demand (--load-on-demand)"));
  status.SetPayload(kWaitsForLoad, absl::Cord(name));
  return status;
}

std::vector<ModelStatus> Catalog::Index() const {
  std::map<std::string, StoreModel> disk = s_.source.Scan();
  std::map<std::string, ModelStatus> all;
  for (ModelStatus& m : List()) all.emplace(m.name, std::move(m));
  for (const auto& [name, _] : disk) all.try_emplace(name, ModelStatus{name, "", {}, "", std::nullopt});
  MutexLock lock(&s_.mu);
  for (auto& [name, m] : all) {
    auto rest = s_.resting.find(name);
    if (m.versions.empty()) m.not_loaded = rest != s_.resting.end() ? rest->second : "not loaded";
  }
  std::vector<ModelStatus> out;
  for (auto& [_, m] : all) out.push_back(std::move(m));
  return out;
}

absl::Status Catalog::NotServedLocked(const std::string& name) const {
  auto it = s_.models.find(name);
  auto rest = s_.resting.find(name);
  const bool not_loaded = (it == s_.models.end() || rest != s_.resting.end()) && s_.on_disk.count(name) > 0 &&
                          (rest != s_.resting.end() || s_.options.model_control == ModelControl::kExplicit);
  if (not_loaded && s_.options.load_on_demand) return LoadsOnDemand(name);
  if (not_loaded && rest != s_.resting.end()) {
    return absl::UnavailableError(absl::StrCat("model '", Capped(name), "' is not loaded: ", rest->second,
                                               "; a request loads it again with --load-on-demand, or an admin does "
                                               "(POST /v2/repository/models/",
                                               Capped(name), "/load)"));
  }
  if (not_loaded) return NotLoaded(name);
  if (it != s_.models.end()) return absl::OkStatus();
  if (s_.options.load_on_demand && s_.busy.count(name) > 0 && s_.on_disk.count(name) > 0) return LoadsOnDemand(name);
  std::vector<std::string> names;
  for (const auto& [n, _] : s_.models) names.push_back(n);
  return UnknownModel(name, names);
}

absl::StatusOr<ServableHandle> Catalog::Resolve(const std::string& name, int64_t version) const {
  MutexLock lock(&s_.mu);
  if (s_.stopped) return absl::UnavailableError("the server is shutting down");
  if (absl::Status missing = NotServedLocked(name); !missing.ok()) return missing;
  auto it = s_.models.find(name);
  // A load (on demand, or a poll's) is under way: the request waits for it rather than be refused.
  const bool wait = s_.options.load_on_demand && s_.busy.count(name) > 0;
  const std::map<int64_t, Record>& versions = it->second.versions;
  if (version == 0) {
    // The newest ready version, a shadow candidate aside: it answers only the requests that name it.
    const int64_t shadow = it->second.shadow ? it->second.shadow->version : 0;
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
      if (v->first != shadow && v->second.status.state == ModelState::kReady) return s_.Used(v->second.servable);
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
  return s_.Used(v->second.servable);
}

std::vector<ModelStatus> Catalog::List() const {
  MutexLock lock(&s_.mu);
  std::vector<ModelStatus> out;
  for (const auto& [name, entry] : s_.models) {
    ModelStatus m{name, entry.policy.ToString(), {}, "", entry.shadow};
    for (auto v = entry.versions.rbegin(); v != entry.versions.rend(); ++v) m.versions.push_back(v->second.status);
    out.push_back(std::move(m));
  }
  return out;
}

std::optional<ShadowSettings> Catalog::Shadow(const std::string& name) const {
  MutexLock lock(&s_.mu);
  const auto it = s_.models.find(name);
  return it == s_.models.end() ? std::nullopt : it->second.shadow;
}

bool Catalog::Has(const std::string& name) const {
  MutexLock lock(&s_.mu);
  return s_.models.count(name) > 0;
}

absl::StatusOr<ModelStatus> Catalog::Get(const std::string& name) const {
  std::vector<std::string> names;
  for (ModelStatus& m : List()) {
    if (m.name == name) return std::move(m);
    names.push_back(m.name);
  }
  return UnknownModel(name, names);
}

}  // namespace qvi

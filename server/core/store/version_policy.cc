#include "server/core/store/version_policy.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace qvi {

VersionActions SelectVersions(const VersionPolicy& policy, const std::vector<int64_t>& on_disk,
                              const std::map<int64_t, KnownVersion>& known) {
  VersionActions actions;
  std::set<int64_t> keep;     // READY or to be loaded: in service once this round's loads are done
  std::set<int64_t> visited;  // versions the policy looked at; their FAILED records stay listed
  // Looks at one wanted version; true when it will serve.
  auto consider = [&](int64_t version) {
    visited.insert(version);
    auto it = known.find(version);
    if (it != known.end() && it->second == KnownVersion::kFailed) return false;
    if (it == known.end() || it->second != KnownVersion::kReady) actions.load.push_back(version);
    keep.insert(version);
    return true;
  };
  switch (policy.kind) {
    case VersionPolicy::Kind::kLatest: {
      int serving = 0;
      for (auto v = on_disk.rbegin(); v != on_disk.rend() && serving < policy.latest; ++v) serving += consider(*v);
      break;
    }
    case VersionPolicy::Kind::kAll:
      for (auto v = on_disk.rbegin(); v != on_disk.rend(); ++v) consider(*v);
      break;
    case VersionPolicy::Kind::kSpecific:
      for (auto v = on_disk.rbegin(); v != on_disk.rend(); ++v) {
        if (std::binary_search(policy.versions.begin(), policy.versions.end(), *v)) consider(*v);
      }
      break;
  }

  const int64_t newest = keep.empty() ? 0 : *keep.rbegin();
  for (const auto& [version, state] : known) {
    if (state == KnownVersion::kReady && !keep.count(version)) {
      std::string reason;
      if (!std::binary_search(on_disk.begin(), on_disk.end(), version)) {
        reason = "removed from the store";
      } else if (policy.kind == VersionPolicy::Kind::kLatest && newest > version) {
        reason = absl::StrCat("replaced by version ", newest, " (version policy ", policy.ToString(), ")");
      } else {
        reason = absl::StrCat("not selected by the version policy ", policy.ToString());
      }
      actions.unload.push_back({version, std::move(reason)});
    } else if ((state == KnownVersion::kFailed || state == KnownVersion::kFailedFilesChanged) &&
               !visited.count(version)) {
      actions.forget.push_back(version);
    }
  }
  return actions;
}

VersionActions SelectVersionsBeside(const VersionPolicy& policy, const std::vector<int64_t>& on_disk,
                                    const std::map<int64_t, KnownVersion>& known, int64_t candidate) {
  if (candidate == 0 || std::find(on_disk.begin(), on_disk.end(), candidate) == on_disk.end()) {
    return SelectVersions(policy, on_disk, known);
  }
  std::vector<int64_t> others;
  for (const int64_t v : on_disk) {
    if (v != candidate) others.push_back(v);
  }
  std::map<int64_t, KnownVersion> known_others = known;
  known_others.erase(candidate);
  VersionActions actions = SelectVersions(policy, others, known_others);
  const auto it = known.find(candidate);
  if (it == known.end() || it->second == KnownVersion::kFailedFilesChanged || it->second == KnownVersion::kUnloading) {
    actions.load.push_back(candidate);
  }
  return actions;
}

}  // namespace qvi

// Which versions of a model to load, keep, take out of service and forget: a pure function of the
// version policy, the versions on disk and what the manager knows of each (TF Serving's aspired
// versions policy). No files, threads or models here, so it is unit-tested alone.
//
// The manager applies it in rounds: it loads what `load` names, asks again with the outcomes (a
// version that failed is now kFailed and skipped, so latest:N reaches for the next older one), and
// once a round has nothing to load it applies `unload` and `forget`. New versions are therefore in
// service before the ones they replace leave it.
#ifndef QVI_SERVER_CORE_STORE_VERSION_POLICY_H_
#define QVI_SERVER_CORE_STORE_VERSION_POLICY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "server/core/manifest/serving_config.h"

namespace qvi {

// What the manager knows of a version it has a record of. A version without a record is not in
// the map: it is loaded when the policy wants it.
enum class KnownVersion {
  kReady,               // in service
  kFailed,              // its last load failed and its files have not changed since: not retried
  kFailedFilesChanged,  // its last load failed and its files changed since: tried again when wanted
  kUnloading,           // out of service, still finishing its requests: loaded afresh when wanted
};

struct VersionActions {
  std::vector<int64_t> load;  // newest first
  struct Unload {
    int64_t version;
    std::string reason;  // "removed from the store", "replaced by version 4 (version policy latest:1)", ...
    bool operator==(const Unload& o) const { return version == o.version && reason == o.reason; }
  };
  std::vector<Unload> unload;   // READY versions the policy no longer wants, ascending
  std::vector<int64_t> forget;  // FAILED versions the policy no longer looks at (their records go), ascending
};

// `on_disk`: ascending. latest:N walks the versions newest first and stops once N are READY or to
// be loaded, skipping kFailed ones; all and specific want every (listed) version on disk.
VersionActions SelectVersions(const VersionPolicy& policy, const std::vector<int64_t>& on_disk,
                              const std::map<int64_t, KnownVersion>& known);

// The same with a shadow candidate (`candidate`, 0: none; docs/serving.md, "Shadow versions"): the policy
// chooses among the other versions (so latest:1 keeps the newest version that is not the candidate serving),
// and the candidate, when it is on disk, is loaded and kept beside them.
VersionActions SelectVersionsBeside(const VersionPolicy& policy, const std::vector<int64_t>& on_disk,
                                    const std::map<int64_t, KnownVersion>& known, int64_t candidate);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_STORE_VERSION_POLICY_H_

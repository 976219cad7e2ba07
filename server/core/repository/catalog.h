// What the repository tells a request and a listing (model_repository.h): the version a request is
// served by (Resolve), or why none -- not found, not loaded, resting, loading on demand, failed -- and
// the models with their versions' states (List, Index, Get). Reads the shared state under its lock.
#ifndef QVI_SERVER_CORE_REPOSITORY_CATALOG_H_
#define QVI_SERVER_CORE_REPOSITORY_CATALOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/repository/repository_state.h"
#include "server/core/repository/repository_types.h"
#include "server/core/repository/servable.h"

namespace qvi {

class Catalog {
 public:
  explicit Catalog(const RepositoryState* state) : s_(*state) {}

  // ModelRepository::Resolve, List, Index, Has and Get: see model_repository.h.
  absl::StatusOr<ServableHandle> Resolve(const std::string& name, int64_t version) const ABSL_LOCKS_EXCLUDED(s_.mu);
  std::vector<ModelStatus> List() const ABSL_LOCKS_EXCLUDED(s_.mu);
  std::vector<ModelStatus> Index() const ABSL_LOCKS_EXCLUDED(s_.mu);
  bool Has(const std::string& name) const ABSL_LOCKS_EXCLUDED(s_.mu);
  absl::StatusOr<ModelStatus> Get(const std::string& name) const ABSL_LOCKS_EXCLUDED(s_.mu);
  std::optional<ShadowSettings> Shadow(const std::string& name) const ABSL_LOCKS_EXCLUDED(s_.mu);

  // UNAVAILABLE with WaitsForLoad's mark: Resolve()'s answer for a model that loads on demand (a front
  // end's tests plan with it too).
  static absl::Status LoadsOnDemand(const std::string& name);

 private:
  using Record = RepositoryState::Record;
  // UNAVAILABLE: `name` is in the store and not loaded (model control is explicit).
  static absl::Status NotLoaded(const std::string& name);
  // Resolve()'s answer for a model it has no record of, or one resting or not loaded; OK when it has one.
  absl::Status NotServedLocked(const std::string& name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  const RepositoryState& s_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_CATALOG_H_

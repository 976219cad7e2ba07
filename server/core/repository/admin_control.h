// Model control (guarantee 8 of model_repository.h): which models are served when the server's model
// control is explicit, and the loads and unloads asked for -- by an admin over the wire, or by a load on
// demand -- each run as a poll of its model on a poll worker, after any poll of it in progress, its
// answer given once that poll has ended.
#ifndef QVI_SERVER_CORE_REPOSITORY_ADMIN_CONTROL_H_
#define QVI_SERVER_CORE_REPOSITORY_ADMIN_CONTROL_H_

#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "server/core/repository/repository_state.h"
#include "server/core/repository/repository_types.h"

namespace qvi {

class AdminControl {
 public:
  using ControlDone = std::function<void(const absl::Status& result)>;

  explicit AdminControl(RepositoryState* state) : s_(*state) {}

  // Options::load_at_start into the wanted models: INVALID_ARGUMENT naming a model the store does not hold.
  absl::Status WantAtStart() ABSL_LOCKS_EXCLUDED(s_.mu);
  // A load (`load`) or unload of `name` for `cause`: queued as a poll of the model (after the one in
  // progress, if any); `done` hears once it has ended. An admin's is refused unless control is explicit.
  void Control(const std::string& name, bool load, LoadCause cause, ControlDone done) ABSL_LOCKS_EXCLUDED(s_.mu);

 private:
  using Record = RepositoryState::Record;
  using Job = RepositoryState::Job;
  // A control's answer once its poll ended: a load is OK with a READY version, else why there is none.
  absl::Status ControlResult(const std::string& name, bool load) const ABSL_LOCKS_EXCLUDED(s_.mu);

  RepositoryState& s_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_ADMIN_CONTROL_H_

#include "tests/cpp/test_util/run.h"

#include "server/core/sched/sync.h"

namespace qvi::testing {

absl::StatusOr<InferenceResponse> RunAndWait(InferenceService& service, Method method, InferenceRequest request) {
  Notification finished;
  absl::StatusOr<InferenceResponse> result = absl::UnknownError("unanswered");
  service.Submit(method, std::move(request), [&](absl::StatusOr<InferenceResponse> out) {
    result = std::move(out);
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

}  // namespace qvi::testing

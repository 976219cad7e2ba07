#include "server/core/sched/cpu_policy.h"

#include <sched.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace qvi {

absl::Status UseBatchScheduling() {
  std::error_code error;
  std::filesystem::directory_iterator tasks("/proc/self/task", error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot list /proc/self/task: ", error.message()));
  for (const auto& task : tasks) {
    int tid = 0;
    if (!absl::SimpleAtoi(task.path().filename().string(), &tid)) continue;
    const sched_param param{};  // SCHED_BATCH has no priority: 0
    if (sched_setscheduler(tid, SCHED_BATCH, &param) != 0 && errno != ESRCH) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot put thread ", tid, " under SCHED_BATCH: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status UseDefaultSchedulingHere() {
  const sched_param param{};
  if (sched_setscheduler(0, SCHED_OTHER, &param) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot put this thread under SCHED_OTHER: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace qvi

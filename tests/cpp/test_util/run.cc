#include "tests/cpp/test_util/run.h"

#include <cstdio>
#include <cstdlib>

#include "server/core/base/sync.h"

namespace qvi::testing {

OutputSet Named(std::initializer_list<std::string_view> names) {
  OutputSet set;
  for (std::string_view name : names) {
    const std::optional<Output> o = OutputNamed(name);
    if (!o) {
      std::fprintf(stderr, "no output named '%.*s' in the catalogue\n", static_cast<int>(name.size()), name.data());
      std::abort();
    }
    set.set(static_cast<size_t>(*o));
  }
  return set;
}

OutputSet Named(const std::vector<std::string>& names) {
  OutputSet set;
  for (const std::string& name : names) set |= Named({std::string_view(name)});
  return set;
}

absl::StatusOr<std::unique_ptr<ModelRepository>> PolledCpuRepository(const std::string& root) {
  ServingConfig defaults;
  defaults.device = "cpu";
  auto repo = ModelRepository::Create({root, defaults});
  if (repo.ok()) (*repo)->Poll();
  return repo;
}

absl::StatusOr<InferenceResponse> RunAndWait(InferenceService& service, Method method, InferenceRequest request,
                                             ServableHandle servable) {
  Notification finished;
  absl::StatusOr<InferenceResponse> result = absl::UnknownError("unanswered");
  service.Submit(
      method, std::move(request),
      [&](absl::StatusOr<InferenceResponse> out) {
        result = std::move(out);
        finished.Notify();
      },
      std::move(servable));
  finished.WaitForNotification();
  return result;
}

}  // namespace qvi::testing

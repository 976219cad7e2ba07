#include "server/core/repository/servable.h"

namespace qvi {

const char* ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading:
      return "LOADING";
    case ModelState::kReady:
      return "READY";
    case ModelState::kFailed:
      return "FAILED";
    case ModelState::kUnloading:
      return "UNLOADING";
    case ModelState::kUnloaded:
      return "UNLOADED";
  }
  return "UNKNOWN";
}

ServableHandle Serving(const absl::StatusOr<ServableHandle>& loaded, const std::string& model, int64_t version) {
  if (!loaded.ok() || *loaded == nullptr || (*loaded)->name != model) return nullptr;
  return version == 0 || (*loaded)->version == version ? *loaded : nullptr;
}

}  // namespace qvi

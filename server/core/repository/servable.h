// A loaded model version as the repository hands it to requests, and a version's state as listings show it.
// The lifecycle (version_loader.h) makes and frees servables; the manager (model_repository.h) decides
// which exist and hands them out.
#ifndef QVI_SERVER_CORE_REPOSITORY_SERVABLE_H_
#define QVI_SERVER_CORE_REPOSITORY_SERVABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/model/model.h"
#include "server/core/runner/model_runner.h"

namespace qvi {

// kUnloaded is only ever reported to listeners: the version is gone and no longer listed.
enum class ModelState { kLoading, kReady, kFailed, kUnloading, kUnloaded };

const char* ModelStateName(ModelState state);

// A version as ListModels/GetModel report it.
struct VersionStatus {
  int64_t version = 0;
  ModelState state = ModelState::kLoading;
  std::string reason;
  std::shared_ptr<const Model> model;  // set when READY or UNLOADING
  ServingConfig serving;               // effective settings, known when READY or UNLOADING
  int64_t memory_bytes = 0;            // its footprint as the budget counts it, when READY or UNLOADING
};

// A loaded version ready to serve: its model, its effective settings and its batch queue with the
// instance threads. Requests hold it through a ServableHandle.
struct Servable {
  std::string name;
  int64_t version = 0;
  uint64_t generation = 0;  // this load of the version: a reload of changed files is another
  std::shared_ptr<const Model> model;
  ServingConfig serving;
  std::unique_ptr<ModelRunner> runner;
  // When a request last resolved it (Env time, ns since the epoch): the budget's least recently used.
  mutable std::atomic<int64_t> last_used_ns{0};
};

// A model version held for the life of one request (TF Serving's ServableHandle): while any handle
// lives, the version stays loaded.
using ServableHandle = std::shared_ptr<const Servable>;

// `loaded` (a load on demand's answer) when it is the version a request for `model` and `version`
// (0: the newest) is to be served by, else null: the request resolves its version itself.
ServableHandle Serving(const absl::StatusOr<ServableHandle>& loaded, const std::string& model, int64_t version);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_SERVABLE_H_

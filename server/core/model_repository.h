// The model store: <root>/<model-name>/<version>/model.pt, versions positive integers.
//
// Guarantees:
//  1. Every version folder found is reported with a state: LOADING, READY, or FAILED with the reason.
//  2. A version that fails to load (corrupt file, bad manifest, warm-up error) is FAILED and
//     nothing else changes: other versions and models keep serving.
//  3. Resolve() hands out a shared_ptr, so a model stays alive while any request holds it.
// Serving settings per model: see serving_config.h (<store>/<model>/serving.json). A bad serving.json
// fails that model's versions with the reason. This version loads every version it finds once, at
// start-up. Version policies, hot reload and
// unloading come with the serving-core work (issue 4).
#ifndef QVI_SERVER_CORE_MODEL_REPOSITORY_H_
#define QVI_SERVER_CORE_MODEL_REPOSITORY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/model.h"
#include "server/core/serving_config.h"

namespace qvi {

enum class ModelState { kLoading, kReady, kFailed, kUnloading };

const char* ModelStateName(ModelState state);

struct VersionStatus {
  int64_t version = 0;
  ModelState state = ModelState::kLoading;
  std::string reason;
  std::shared_ptr<const Model> model;  // set when ready
  ServingConfig serving;               // effective settings, known when ready
};

// A model version held for the life of one request (TF Serving's ServableHandle).
struct ServableHandle {
  std::shared_ptr<const Model> model;
  int64_t version = 0;
  ServingConfig serving;
};

struct ModelStatus {
  std::string name;
  std::vector<VersionStatus> versions;  // newest first
};

class ModelRepository {
 public:
  struct Options {
    std::string root;
    ServingConfig defaults;  // the server's; a model's manifest and serving.json refine them
  };
  // Called after each load attempt, e.g. to log it and to update health.
  using LoadListener = std::function<void(const std::string& name, const VersionStatus&)>;

  static absl::StatusOr<std::unique_ptr<ModelRepository>> Create(const Options& options);

  // Scans the store and loads every version not yet known. Returns once all attempts are done.
  void LoadAll(const LoadListener& listener) ABSL_LOCKS_EXCLUDED(mu_);

  // The model for a request: version 0 = the newest READY version. NOT_FOUND names what exists;
  // UNAVAILABLE says why the version cannot serve.
  absl::StatusOr<ServableHandle> Resolve(const std::string& name, int64_t version) const
      ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<ModelStatus> List() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ModelStatus> Get(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit ModelRepository(Options options) : options_(std::move(options)) {}

  // Version folders under the store: name -> versions (ascending).
  std::map<std::string, std::vector<int64_t>> Scan() const;

  const Options options_;
  mutable absl::Mutex mu_;
  // name -> version -> status
  std::map<std::string, std::map<int64_t, VersionStatus>> models_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_REPOSITORY_H_

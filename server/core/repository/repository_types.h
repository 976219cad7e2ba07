// The model repository's vocabulary (model_repository.h): its options, the causes of loads, a model's
// status as listings show it, and how a load on demand marks its refusals.
#ifndef QVI_SERVER_CORE_REPOSITORY_REPOSITORY_TYPES_H_
#define QVI_SERVER_CORE_REPOSITORY_REPOSITORY_TYPES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/base/env.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/model/graphs.h"
#include "server/core/model/model.h"
#include "server/core/repository/memory_budget.h"
#include "server/core/repository/servable.h"
#include "server/core/runner/observer.h"
#include "server/core/sched/executor.h"
#include "server/core/store/version_policy.h"

namespace qvi {

// Which models are served (--model-control): the store's (kPoll), or those loaded over the wire (kExplicit).
enum class ModelControl { kPoll, kExplicit };

struct ModelStatus {
  std::string name;
  std::string version_policy;
  std::vector<VersionStatus> versions;   // newest first
  std::string not_loaded;                // Index(): why a model with no versions is not loaded ("" not asked)
  std::optional<ShadowSettings> shadow;  // serving.json's shadow candidate, if any
};

// Why a model was loaded (a poll of the store, an admin's RequestLoad, a request with load-on-demand)
// or unloaded to save memory (the budget, idleness): metrics labels.
enum class LoadCause { kPoll, kAdmin, kDemand };
const char* LoadCauseName(LoadCause cause);

// The payload of a load on demand's refusal when it gave up because its requests had all left.
extern const char kGaveUp[];

// UNAVAILABLE from Resolve() for a model that loads on demand: the caller hands the request to
// ModelRepository::WhenLoaded and tries again once.
bool WaitsForLoad(const absl::Status& status);

struct RepositoryOptions {
  // Called after each state change, outside the repository's lock, from the thread that made it.
  using Listener = std::function<void(const std::string& name, const VersionStatus&)>;

  std::string root;
  ServingConfig defaults;        // the server's; a model's manifest and serving.json refine them
  VersionPolicy version_policy;  // for models whose serving.json names none
  // Time and threads: the poll interval, load timeouts, the batch queues. Env::Default() when null.
  const Env* env = nullptr;
  Listener listener;
  ServingObserver* observer = nullptr;  // metrics of every version's batches; may be null
  Executor* answers = nullptr;          // makes every version's answers (ModelRunner); null: the instance threads do
  bool pipeline = true;                 // ModelRunner's pipeline, where the model is asynchronous
  absl::Duration load_timeout = absl::Minutes(10);  // per version: Model::Load with its warm-up
  int load_threads = 4;                             // models polled (and loaded) at once
  // CUDA graphs (graphs.h): the backend, null when this process has none, and why.
  GraphBackend* graph_backend = nullptr;
  std::string graph_backend_note = "no CUDA graph backend in this process";
  // Reads and warms up one version; Model::Load unless a test puts a fake here.
  std::function<absl::StatusOr<std::unique_ptr<Model>>(const std::string& dir, const LoadOptions& options)> load;
  // After each reload of a READY version whose model files changed (model_repository.h, guarantee 7): OK when the new
  // files serve, else why the loaded files still do. From a poll worker, outside the lock.
  std::function<void(const std::string& name, int64_t version, const absl::Status& reload)> files_changed;
  ModelControl model_control = ModelControl::kPoll;
  // kExplicit: the models loaded at start-up (--load-model); "*" is every model the store holds then.
  std::vector<std::string> load_at_start;
  // model_repository.h, guarantee 9. Not enabled: no budget (footprints are measured all the same).
  MemoryBudget memory_budget;
  const MemoryMeter* meter = nullptr;  // SystemMemoryMeter() when null
  // A model no request asked for in this long is unloaded (it rests); zero: never.
  absl::Duration unload_idle_after = absl::ZeroDuration();
  // A request for a resting model (or, explicit, one in the store not loaded) loads it (WhenLoaded).
  bool load_on_demand = false;
  // Models loading on demand at once, each however many requests wait for it; more are refused.
  int max_waiting_loads = 8;
  // A model loaded, or unloaded to save memory: `reason` is LoadCauseName's, or "budget"/"idle".
  std::function<void(const std::string& name, bool loaded, const char* reason)> memory_event;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_REPOSITORY_TYPES_H_

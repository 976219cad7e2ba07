// A model version's life from its files to its end (Triton's ModelLifeCycle): read and warmed up on a
// thread of its own within a deadline, made a Servable with its batch runner, and, once the last request
// holding it has let go, stopped and freed on the unloader thread. Which versions exist, when they load
// and who may hold them is the manager's (model_repository.h).
//
// Guarantees:
//  1. Load() returns within Options::load_timeout of its call, or at Cancel(), whatever the load does. A
//     load still running then is abandoned (DEADLINE_EXCEEDED, CANCELLED) and runs on in a thread of its
//     own that touches nothing of the loader's but its own attempt; if it ever returns, its model is freed
//     there. StillRunning() names the abandoned loads that have not returned.
//  2. Load() resolves the version's serving settings once (its manifest is known only after reading it)
//     and captures its CUDA graphs before it returns; a manifest naming another model than `name` fails.
//  3. A servable Load() made is freed on the unloader thread, never on the thread that let go of its last
//     handle (often one of its own instance threads, which must not join itself): its batch queue
//     stopped, its model freed, the freed memory handed back to the system; then Options::unloaded hears
//     of it, on that thread.
//  4. After Cancel(), Load() is refused. Stop() returns once every servable made has been freed -- so it
//     waits for every request holding one -- and stops the unloader; never for an abandoned load.
#ifndef QVI_SERVER_CORE_REPOSITORY_VERSION_LOADER_H_
#define QVI_SERVER_CORE_REPOSITORY_VERSION_LOADER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/base/env.h"
#include "server/core/base/sync.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/model/graphs.h"
#include "server/core/model/model.h"
#include "server/core/repository/servable.h"
#include "server/core/runner/observer.h"
#include "server/core/sched/executor.h"

namespace qvi {

class VersionLoader {
 public:
  // Reads and warms up one version; Model::Load unless a test puts a fake here.
  using LoadFn = std::function<absl::StatusOr<std::unique_ptr<Model>>(const std::string& dir, const LoadOptions&)>;
  // After a servable was freed (guarantee 3): `generation` tells which load of the version it was.
  using Unloaded = std::function<void(const std::string& name, int64_t version, uint64_t generation)>;

  struct Options {
    ServingConfig defaults;               // the server's; the manifest and the version's serving.json refine them
    const Env* env = nullptr;             // Env::Default() when null
    ServingObserver* observer = nullptr;  // metrics of every servable's batches; may be null
    Executor* answers = nullptr;          // makes the answers (ModelRunner); null: the instance threads do
    bool pipeline = true;                 // ModelRunner's pipeline, where the model is asynchronous
    absl::Duration load_timeout = absl::Minutes(10);
    GraphBackend* graph_backend = nullptr;  // CUDA graphs (graphs.h): null when this process has none,
    std::string graph_backend_note;         // and why
    LoadFn load;
    Unloaded unloaded;
  };

  explicit VersionLoader(Options options);
  ~VersionLoader();  // Cancel() and Stop()
  VersionLoader(const VersionLoader&) = delete;
  VersionLoader& operator=(const VersionLoader&) = delete;

  // Version `version` of model `name` from the folder `dir`, with its serving.json's `overrides`, as the
  // servable of load number `generation`.
  absl::StatusOr<ServableHandle> Load(const std::string& name, int64_t version, uint64_t generation,
                                      const std::string& dir, const ServingOverrides& overrides)
      ABSL_LOCKS_EXCLUDED(loads_mu_, retire_mu_);
  // Wakes every Load() waiting, which returns CANCELLED, and refuses new ones.
  void Cancel() ABSL_LOCKS_EXCLUDED(loads_mu_);
  // Guarantee 4. More than once is fine, but not from two threads at once.
  void Stop() ABSL_LOCKS_EXCLUDED(retire_mu_);
  // "name@version (running for 12 s)" for each abandoned load that has not returned.
  std::vector<std::string> StillRunning() const ABSL_LOCKS_EXCLUDED(loads_mu_);

 private:
  struct Attempt;  // one load on its own thread
  struct Loaded {
    std::unique_ptr<Model> model;
    ServingConfig serving;
  };
  absl::StatusOr<Loaded> Run(const std::string& what, const std::string& dir, const ServingOverrides& overrides)
      ABSL_LOCKS_EXCLUDED(loads_mu_);
  static std::string RunningFor(const Attempt& attempt, absl::Time now);  // "12 s"
  // The shared_ptr deleter of every servable: hands it to the unloader thread, never blocks.
  void Retire(Servable* servable) ABSL_LOCKS_EXCLUDED(retire_mu_);
  void UnloaderLoop() ABSL_LOCKS_EXCLUDED(retire_mu_);

  const Options options_;
  const Env* env_;

  // The loads in progress and the abandoned ones not yet returned. Taken before an attempt's own mutex.
  mutable Mutex loads_mu_;
  std::vector<std::shared_ptr<Attempt>> loads_ ABSL_GUARDED_BY(loads_mu_);
  bool cancelled_ ABSL_GUARDED_BY(loads_mu_) = false;

  Mutex retire_mu_;
  CondVar retire_changed_;
  std::vector<Servable*> retiring_ ABSL_GUARDED_BY(retire_mu_);
  int live_ ABSL_GUARDED_BY(retire_mu_) = 0;  // servables made and not yet freed
  bool stopping_ ABSL_GUARDED_BY(retire_mu_) = false;
  std::thread unloader_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_VERSION_LOADER_H_

// The core's entry point for Classify and Tag. A request is checked against the limits and the
// model and its texts are tokenised on a request thread (the executor); its texts then join the
// model's batch queue (ModelRunner), where they may share batches with other callers' texts; each
// text's row of the outputs becomes labels or spans, tokens and explanations. Knows nothing of gRPC.
//
// Contract:
//  1. Submit() calls `done` exactly once: from a model instance thread with the answer, from a
//     request thread with an error, or at once with RESOURCE_EXHAUSTED when a queue is full.
//  2. A request runs on one version from its checks to its answer: the `servable` the caller
//     resolved (and checked its own plan against: OIP reads the manifest to plan its tensors), or,
//     when the caller passes none, the version its model and version resolve to once, here.
//  3. Errors name the field and the limit: INVALID_ARGUMENT for bad requests, NOT_FOUND for unknown
//     models, UNAVAILABLE for versions that cannot serve, DEADLINE_EXCEEDED / CANCELLED when the
//     request expired or was cancelled before the model ran, INTERNAL when the model failed.
#ifndef QVI_SERVER_CORE_SERVING_INFERENCE_SERVICE_H_
#define QVI_SERVER_CORE_SERVING_INFERENCE_SERVICE_H_

#include <functional>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "server/core/base/sync.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request.h"
#include "server/core/request/request_checks.h"
#include "server/core/runner/model_runner.h"
#include "server/core/sched/executor.h"
#include "server/core/serving/drift.h"
#include "server/core/serving/response_cache.h"
#include "server/core/serving/shadow.h"

namespace qvi {

class OcclusionRecord;

// A request past its deadline or cancelled: the error to answer it with.
absl::Status CheckLive(const InferenceRequest& r, const Env& env);

class InferenceService {
 public:
  using Done = std::function<void(absl::StatusOr<InferenceResponse>)>;

  // Texts join the batch queue of the version they resolve to (see ModelRepository).
  // `cache` (response_cache.h) may be null: no cache.
  InferenceService(ModelRepository* repository, Executor* executor, RequestLimits limits,
                   ResponseCache* cache = nullptr)
      : repository_(repository), executor_(executor), limits_(limits), cache_(cache) {}

  void Submit(Method method, InferenceRequest request, Done done, ServableHandle servable = nullptr);
  // Shadow versions (shadow.h): a request that names no version, for a model with a candidate, has a sample of
  // its texts mirrored once it is answered. Null (the default): none are. Set before the first Submit.
  void SetShadow(ShadowMirror* shadow) { shadow_ = shadow; }
  const ShadowMirror* shadow() const { return shadow_; }
  // Drift gauges (drift.h): each answer to a caller is added to its version's window. Null (the default): none
  // is. Set before the first Submit.
  void SetDrift(DriftMonitor* drift) { drift_ = drift; }
  const DriftMonitor* drift() const { return drift_; }

  const RequestLimits& limits() const { return limits_; }
  // Runs `work` on a request thread, as a large request's preparation runs; false when their queue is full
  // (nothing ran). For a front end's own work that is too long for its I/O thread (TEI's /tokenize).
  bool TryRun(std::function<void()> work) { return executor_->TrySubmit(std::move(work)); }
  // ModelRepository::WhenLoaded, for a front end that resolves before it submits (OIP's plan).
  void WhenLoaded(const std::string& model, absl::Time deadline, ModelRepository::LoadedDone ready) {
    repository_->WhenLoaded(model, deadline, std::move(ready));
  }
  // The clock of InferenceRequest::deadline (the repository's environment).
  const Env& env() const { return *repository_->env(); }

 private:
  struct Prepared {
    ServableHandle handle;
    InferenceResponse response;  // tokens filled in, results to come
    std::vector<std::vector<int64_t>> ids;
  };
  // Checks the request against the version that answers, with that version's defaults applied to its
  // options (ApplyServingDefaults), and tokenises its texts.
  absl::StatusOr<Prepared> Prepare(Method method, InferenceRequest& request, ServableHandle servable) const;
  // Takes the request by value: its texts move into the answer's post-processing, uncopied.
  // A model that loads on demand (WaitsForLoad) is waited for, once, within the request's deadline.
  // `cached`: the response cache was looked in already (AnswerWithCache's request of the texts it lacks).
  void Dispatch(Method method, InferenceRequest request, Done done, ServableHandle servable, bool waited = false,
                bool cached = false);
  // With a response cache (cached_dispatch.cc): the texts it holds are answered from it, the others
  // go to the model as a request of their own, and their answers are kept. False when the request is
  // left to the usual path (no cache, it fails its checks, or its model does not resolve); else `done`
  // is taken.
  bool AnswerWithCache(Method method, InferenceRequest& request, Done& done, ServableHandle& servable, bool waited);
  // Whether a request whose preparation ended so is to wait for its model's load on demand: it was
  // resolved here (not by its API), and has not waited before.
  static bool WaitHere(const absl::Status& prepared, bool resolves, bool waited);
  // `done`, which once the request is answered mirrors a sample of its texts to the model's shadow candidate,
  // if it has one and the request names no version (shadow.h); else `done` itself.
  Done WithShadow(Method method, const InferenceRequest& request, Done done);
  // `done`, which adds the answer's texts to the drift gauges' window of its version (drift.h), then answers.
  Done WithDrift(bool raw_scores, Done done);
  // Dispatch again once the request's model has loaded on demand, or answers why it has not.
  void DispatchWhenLoaded(Method method, InferenceRequest request, Done done);
  // One text's answer from its row of checked outputs. May throw c10::Error. A sub-word model's row is
  // grouped into words first (subwords.h), unless options.subwords.
  static void PostProcessRow(Method method, const Model& model, const OutputOptions& options, const std::string& text,
                             const ModelOutputs& outputs, int64_t row, TextResult& result);
  // options.occlusion's values into each text's answer, once every row is done; a failure (outputs
  // that do not fit the model) fails the request. A sub-word model's values are per word: in the
  // sub-word view, each sub-word shows its word's.
  static absl::Status FillOcclusion(const OcclusionRecord& record, int texts, bool subword_view,
                                    InferenceResponse& response);
  // The same over `result.tokens` as the model's positions.
  static void PostProcessTokens(Method method, const Model& model, const OutputOptions& options,
                                const std::string& text, const ModelOutputs& outputs, int64_t row, TextResult& result);

  ModelRepository* repository_;
  Executor* executor_;
  const RequestLimits limits_;
  ResponseCache* const cache_;
  ShadowMirror* shadow_ = nullptr;
  DriftMonitor* drift_ = nullptr;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_INFERENCE_SERVICE_H_

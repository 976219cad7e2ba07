// The core's entry point for Classify and Tag. A request is checked against the limits and the
// model and its texts are tokenised on a request thread (the executor); its texts then join the
// model's batch queue (ModelRunner), where they may share batches with other callers' texts; each
// text's row of the outputs becomes labels or spans, tokens and explanations. Knows nothing of gRPC.
//
// Contract:
//  1. Submit() calls `done` exactly once: from a model instance thread with the answer, from a
//     request thread with an error, or at once with RESOURCE_EXHAUSTED when a queue is full.
//  2. Errors name the field and the limit: INVALID_ARGUMENT for bad requests, NOT_FOUND for unknown
//     models, UNAVAILABLE for versions that cannot serve, DEADLINE_EXCEEDED / CANCELLED when the
//     request expired or was cancelled before the model ran, INTERNAL when the model failed.
#ifndef QVI_SERVER_CORE_INFERENCE_SERVICE_H_
#define QVI_SERVER_CORE_INFERENCE_SERVICE_H_

#include <functional>
#include <map>
#include <string>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/base/thread_annotations.h"
#include "server/core/sync.h"
#include "server/core/executor.h"
#include "server/core/model_runner.h"
#include "server/core/model_repository.h"
#include "server/core/request.h"

namespace qvi {

struct RequestLimits {
  int max_texts = 256;          // texts per request
  int max_text_bytes = 65536;   // UTF-8 bytes per text
  // Requests whose texts add up to fewer bytes are checked and tokenised on the calling (gRPC)
  // thread, saving a hand-off to a request thread; larger ones go to a request thread, so that a
  // big request never holds a gRPC thread. 0: always a request thread.
  int64_t inline_prepare_bytes = 0;
  // Client strings the server echoes (in answers, errors and logs) are capped: longer ones are
  // refused before anything else is done with them.
  int max_model_name_bytes = 256;
  int max_request_id_bytes = 256;
  // The largest answer the transport sends (gRPC's send limit). A request whose answer is estimated,
  // from its texts' tokens and the outputs it asks for, to be larger is refused before the model
  // runs. 0: no limit.
  int64_t max_response_bytes = 0;
};

// An estimate of the protobuf size of the answer to `request`, whose texts have been tokenised into
// `response` (tokens filled in, outputs not yet), for a model with manifest `m`. Counts what
// dominates: per-token fields and explanations, labels or spans, and the per-layer maps (T values per
// map of gates, T x T per attention map, 4 bytes each). Exposed for tests.
int64_t EstimateResponseBytes(Method method, const Manifest& m, const InferenceRequest& request,
                              const InferenceResponse& response);

// `s`, or its first bytes and its length when it is longer than `max`: for logs and errors.
std::string Capped(const std::string& s, size_t max = 64);



class InferenceService {
 public:
  using Done = std::function<void(absl::StatusOr<InferenceResponse>)>;

  // Texts join the batch queue of the version they resolve to (see ModelRepository).
  InferenceService(const ModelRepository* repository, Executor* executor, RequestLimits limits)
      : repository_(repository), executor_(executor), limits_(limits) {}

  void Submit(Method method, InferenceRequest request, Done done);

  const RequestLimits& limits() const { return limits_; }

  // The request from the calling thread (preparation) and a model instance (batching); waits.
  absl::StatusOr<InferenceResponse> Run(Method method, const InferenceRequest& request);

 private:
  struct Prepared {
    ServableHandle handle;
    InferenceResponse response;  // tokens filled in, results to come
    std::vector<std::vector<int64_t>> ids;
  };
  absl::StatusOr<Prepared> Prepare(Method method, const InferenceRequest& request) const;
  void Dispatch(Method method, const InferenceRequest& request, Done done);
  // One text's answer from its row of checked outputs. May throw c10::Error.
  static void PostProcessRow(Method method, const Manifest& manifest, const OutputOptions& options,
                             const std::string& text, const ModelOutputs& outputs, int64_t row, TextResult& result);

  const ModelRepository* repository_;
  Executor* executor_;
  const RequestLimits limits_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_INFERENCE_SERVICE_H_

// The core's entry point for Classify and Tag: checks a request against the limits and the model,
// tokenises its texts, runs them through the model as one padded batch, and turns the outputs into
// labels, spans, tokens and explanations. Knows nothing of gRPC.
//
// Contract:
//  1. Submit() calls `done` exactly once, on an executor thread, or at once with RESOURCE_EXHAUSTED
//     when the executor's queue is full.
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
#include "server/core/executor.h"
#include "server/core/model_repository.h"
#include "server/core/request.h"

namespace qvi {

struct RequestLimits {
  int max_texts = 256;          // texts per request
  int max_text_bytes = 65536;   // UTF-8 bytes per text
};

class InferenceService {
 public:
  using Done = std::function<void(absl::StatusOr<InferenceResponse>)>;

  InferenceService(const ModelRepository* repository, Executor* executor, RequestLimits limits)
      : repository_(repository), executor_(executor), limits_(limits) {}

  void Submit(Method method, InferenceRequest request, Done done) const;

  // The whole request in the calling thread.
  absl::StatusOr<InferenceResponse> Run(Method method, const InferenceRequest& request) const;

  const RequestLimits& limits() const { return limits_; }

 private:
  // Labels, spans, tokens and explanations from checked outputs. May throw c10::Error.
  static void PostProcess(Method method, const Manifest& manifest, const InferenceRequest& request,
                          std::map<std::string, torch::Tensor>& outputs, InferenceResponse& response);

  const ModelRepository* repository_;
  Executor* executor_;
  const RequestLimits limits_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_INFERENCE_SERVICE_H_

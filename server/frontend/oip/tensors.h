// The Open Inference Protocol (OIP v2, inference.GRPCInferenceService) in the core's terms: a
// ModelInfer request becomes a Classify or Tag request, and the core's answer becomes named output
// tensors. Pure functions of the request, the model's manifest and the answer; OipApi (api.h) does
// the calling. docs/serving.md "Open Inference Protocol" documents the tensors.
//
// One input, "text": BYTES, shape [N] (or [N, 1]), one UTF-8 text per element, as raw contents
// (each element a 4-byte little-endian length and its bytes) or as contents.bytes_contents.
// Outputs: the wire outputs of the output catalogue (server/core/outputs/outputs.cc: each row's name,
// datatype and shape) that the model has; the request's `outputs` list selects them, and without
// one an answer carries its task's answer and what the parameters turn on (DefaultWireOutputs).
// "probabilities" takes the output parameter "classification" = K: BYTES [N, K] "score:index:label",
// best first (Triton's classification extension).
// T is the most tokens any text of the request was read with; the rows of shorter texts are padded
// with "" and 0, and token_count says where each row ends. Request parameters: top_k (int64),
// attention, gates, tokens, layer_gates, layer_attention (bool: add those outputs to the defaults,
// and compute them), truncation ("truncate" | "error"), layers and heads (int64 or a string "0,2"),
// reduction ("none" | "mean_heads" | "mean_all"), timeout (int64 microseconds, as Triton's),
// faithfulness_top_k (int64, classifiers with α: the per-answer check of the native API's
// options.faithfulness, answered as faithfulness_label, _score, _score_without and _removed).
// The check's tensors can be named only with it.
#ifndef QVI_SERVER_FRONTEND_OIP_TENSORS_H_
#define QVI_SERVER_FRONTEND_OIP_TENSORS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inference/open_inference_grpc.pb.h"
#include "server/core/manifest/manifest.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/outputs/answer_tensors.h"
#include "server/core/request/request.h"

namespace qvi::oip {

// The catalogue's tensor view of the model (answer_tensors.h), as ModelMetadata lists it.
inline std::vector<TensorSpec> OutputSpecs(const Manifest& manifest) { return WireOutputs(manifest); }
inline TensorSpec InputSpec() { return TextInput(); }

struct RequestedOutput {
  Output output;
  int classification = 0;  // Triton's classification extension: K best as "score:index:label"
  const char* name() const { return OutputName(output); }
};

// A ModelInfer request in the core's terms.
struct InferPlan {
  Method method = Method::kClassify;
  InferenceRequest request;                           // model, version, texts, options, request_id
  std::vector<RequestedOutput> outputs;               // in the answer's order
  absl::Duration timeout = absl::InfiniteDuration();  // the "timeout" parameter
  int top_k = 1;                                      // K of labels / scores
};

// request.cc: the request half. ----------------------------------------------------------

// "" is 0 (the newest ready version); otherwise a positive integer. INVALID_ARGUMENT names `field`.
absl::StatusOr<int64_t> ParseVersion(const std::string& field, const std::string& version);

// Checks `in` against the model and the protocol; errors name the field and what was wrong. `serving`: the
// version's config, whose defaults (ApplyServingDefaults) fill what the parameters leave unset.
absl::StatusOr<InferPlan> FromModelInfer(const inference::ModelInferRequest& in, const Manifest& manifest,
                                         const ServingConfig& serving);

// response.cc: the response half. --------------------------------------------------------

// The size of ToModelInfer's answer, at least (exact for the tensors; spans estimated from above),
// computed without building it: an answer over the send limit is refused before it is built.
int64_t AnswerBytes(const InferenceResponse& answer, const InferPlan& plan);

// The same, at most, for the texts of `request` once tokenised, before the model runs (AnswerView::Before):
// what the core checks against the send limit, so that an answer too big to send is refused as
// INVALID_ARGUMENT before any work, padding included.
int64_t AnswerBytesBefore(const InferenceRequest& request, const InferenceResponse& tokenised, const InferPlan& plan);

// The answer's tensors, raw (raw_output_contents), in the order of `plan.outputs`. May throw
// std::bad_alloc.
void ToModelInfer(const InferenceResponse& answer, const InferPlan& plan, const std::string& id,
                  inference::ModelInferResponse* out);

}  // namespace qvi::oip

#endif  // QVI_SERVER_FRONTEND_OIP_TENSORS_H_

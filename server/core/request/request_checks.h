// The checks of a request that need no model loaded, and the limits they enforce: torch-free, so
// that the fuzz targets (fuzz/) build them alone.
#ifndef QVI_SERVER_CORE_REQUEST_REQUEST_CHECKS_H_
#define QVI_SERVER_CORE_REQUEST_REQUEST_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/core/manifest/manifest.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/request/request.h"

namespace qvi {

struct RequestLimits {
  int max_texts = 256;         // texts per request
  int max_text_bytes = 65536;  // UTF-8 bytes per text
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
  // options.occlusion: the tokens of a request's leave-one-out variants, Σ n·(n − 1) over its texts
  // of n tokens (each text again without each of its tokens), at most. 0: occlusion is refused.
  int64_t max_occlusion_tokens = 131072;
};

// The model tensors a request needs: its task's answer and what its switches turn on.
OutputSet WantedOutputs(const Manifest& m, const OutputOptions& o);

// options.occlusion's rows for a text of `n` tokens: n variants (each token deleted once) of n − 1
// tokens; none for a text of fewer than two tokens (nothing would be left to read).
inline int64_t OcclusionVariants(int64_t n) { return n >= 2 ? n : 0; }
inline int64_t OcclusionVariantTokens(int64_t n) { return OcclusionVariants(n) * (n - 1); }

// An estimate of the protobuf size of the answer to `request`, whose texts have been tokenised into
// `response` (tokens filled in, outputs not yet), for a model with manifest `m`. Counts what
// dominates: per-token fields and explanations, labels or spans, and the per-layer maps (T values per
// map of gates, T x T per attention map, 4 bytes each). Exposed for tests.
int64_t EstimateResponseBytes(Method method, const Manifest& m, const InferenceRequest& request,
                              const InferenceResponse& response);

// The per-layer maps each text's answer holds for these options: one per selected layer and head,
// one per layer when the heads are averaged, one when everything is; 0 when none are asked for.
int64_t LayerMapsPerText(const Manifest& m, const OutputOptions& o);

// `s`, or its first bytes and its length when it is longer than `max`: for logs and errors.
std::string Capped(const std::string& s, size_t max = 64);

// A model name from a client: not empty, and within max_model_name_bytes; INVALID_ARGUMENT naming
// `field` (the field as the caller's API spells it: model.name, name, model_name). Both APIs answer
// an empty or long name alike.
absl::Status CheckModelNameBytes(const char* field, const std::string& name, const RequestLimits& limits);

// The request's own fields against the limits: model name, version, request id, texts (count,
// bytes, UTF-8), top_k. INVALID_ARGUMENT naming the field and the limit.
absl::Status CheckRequest(const InferenceRequest& r, const RequestLimits& limits);
// options.faithfulness.top_k's largest value: the check deletes at most this many tokens per text.
inline constexpr int kMaxFaithfulnessTopK = 32;

// Layer or head indices against a model with `count` of them. INVALID_ARGUMENT naming `field`.
absl::Status CheckIndices(const char* field, const std::vector<int>& indices, int count, const char* what);

// The model's defaults for what the request left unset: serving.json's abstain_below (serving/trust.h), for a
// request that set no abstain_below and asked for calibrated scores. Applied once the version that answers is
// known, before its checks, its response-cache key and the answer's size (and by OIP's plan, whose outputs
// follow it).
void ApplyServingDefaults(const ServingConfig& serving, OutputOptions& options);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REQUEST_REQUEST_CHECKS_H_

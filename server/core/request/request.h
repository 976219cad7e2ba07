// The core's request: what to run and which outputs to answer with (its answer: outputs/answer.h).
// It mirrors the public API (proto/) without depending on it: the front ends convert between the
// two, so the core builds and tests without gRPC.
#ifndef QVI_SERVER_CORE_REQUEST_REQUEST_H_
#define QVI_SERVER_CORE_REQUEST_REQUEST_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/core/outputs/answer.h"
#include "server/core/outputs/outputs.h"
#include "server/core/sched/priority.h"

namespace qvi {

enum class Method { kClassify, kTag };

// Which layers and heads of the per-layer outputs an answer carries, and how they are reduced.
struct LayerSelection {
  enum class Reduction { kNone, kMeanHeads, kMeanAll };
  std::vector<int> layers;  // empty = all
  std::vector<int> heads;   // empty = all
  Reduction reduction = Reduction::kNone;
};

struct OutputOptions {
  int top_k = 0;  // 0 = the best label only
  // The outputs asked for beyond the task's answer (the catalogue's, outputs.h): the native API's
  // switches (Ask) or the outputs an OIP request names. The one form they keep to the answer.
  OutputSet outputs;
  bool error_on_truncation = false;
  LayerSelection layers;
  // Classify: delete α's top `faithfulness_top_k` tokens and run the rest again (0 = no check).
  int faithfulness_top_k = 0;
  // A sub-word model's answer per sub-word (its special tokens included) instead of per word: the
  // tokens, their explanations and maps. Entities still start and end on words. Ignored by other models.
  bool subwords = false;
  // The raw softmax (a tagger: CRF marginals) instead of the probabilities calibrated by the model card's
  // temperature (Manifest::ScoreTemperature). Ignored by a model without calibration.
  bool raw_scores = false;
  // Classify: the label set that holds the true label with this probability (trust.h); unset = none.
  std::optional<double> coverage;
  // Mark answers whose calibrated probability is below this abstained (trust.h); unset = none.
  std::optional<double> abstain_below;
  // Tag: each token's probability of every tag, in the manifest's order (the CRF's marginals, calibrated as
  // the spans' scores; TokenOutput::tag_probabilities). vLLM's /pooling token_classify asks for it.
  bool tag_probabilities = false;

  // Asks for every output `on` turns on (options.attention: α and the sentence α, say).
  void Ask(OutputSwitch on) { outputs |= SwitchedBy(on); }
  bool Asks(OutputSwitch on) const { return AnySwitchedBy(outputs, on); }
  bool Asks(Output output) const { return outputs.test(static_cast<size_t>(output)); }
  // Whether per-layer gates or maps are asked for.
  bool AsksLayers() const { return Asks(OutputSwitch::kLayerGates) || Asks(OutputSwitch::kLayerAttention); }
  // Whether anything per token is asked for (the answer then keeps its tokens; a sub-word model's also
  // with `subwords`).
  bool AsksPerToken() const {
    return Asks(OutputSwitch::kTokens) || Asks(OutputSwitch::kAttention) || Asks(OutputSwitch::kGates) ||
           Asks(OutputSwitch::kContributions) || Asks(OutputSwitch::kOcclusion) || AsksLayers();
  }
};

// The span of the call a request belongs to, when the call's trace is exported (OTLP,
// server/tracing/): what the span of each batch that runs its texts links to.
struct SpanRef {
  std::array<uint8_t, 16> trace_id{};
  std::array<uint8_t, 8> span_id{};
};

struct InferenceRequest {
  std::string model;
  int64_t version = 0;  // 0 = newest ready
  std::vector<std::string> texts;
  OutputOptions options;
  std::string request_id;
  // Its place in the batch queue (priority.h). The front ends set the caller's (its request, else its
  // API key's default); kDefault queues it as normal.
  Priority priority = Priority::kDefault;
  // Checked before the model runs: a request past its deadline or cancelled never reaches it. A time
  // of the core's monotonic clock (InferenceService::env(); MonotonicDeadline converts gRPC's).
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> is_cancelled;
  // The size of the API's answer, at most, from the texts once tokenised (`tokenised`: tokens filled
  // in, outputs not yet), for an API whose answer is not the native one (OIP's padded tensors). The
  // core refuses a request whose answer would exceed the send limit before the model runs. Null:
  // the native answer's estimate (EstimateResponseBytes).
  std::function<int64_t(const InferenceRequest& request, const InferenceResponse& tokenised)> estimate_response_bytes;
  // Called once with the answer's estimated size, after the checks and before the request is queued:
  // the caller counts those bytes as held until the call is answered (the in-flight limit, which
  // bounds requests and their answers together), and a non-OK status refuses the request. Null: none.
  std::function<absl::Status(int64_t answer_bytes)> hold_answer_bytes;
  // Set when the call's trace is sampled for export: the batch spans link to it.
  std::optional<SpanRef> span;
  // The server's own request (a redaction's, serving/redaction.h), not a caller's: it joins no drift window and
  // is never mirrored to a shadow candidate.
  bool internal = false;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REQUEST_REQUEST_H_

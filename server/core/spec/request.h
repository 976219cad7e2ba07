// The core's request and answer types. They mirror the public API (proto/) without depending on
// it: the gRPC adapter converts between the two, so the core builds and tests without gRPC.
#ifndef QVI_SERVER_CORE_SPEC_REQUEST_H_
#define QVI_SERVER_CORE_SPEC_REQUEST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/core/spec/outputs.h"
#include "server/core/text/tokenizer.h"

namespace qvi {

struct Manifest;

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

  // Asks for every output `on` turns on (options.attention: α and the sentence α, say).
  void Ask(OutputSwitch on) { outputs |= SwitchedBy(on); }
  bool Asks(OutputSwitch on) const { return AnySwitchedBy(outputs, on); }
  bool Asks(Output output) const { return outputs.test(static_cast<size_t>(output)); }
  // Whether per-layer gates or maps are asked for.
  bool AsksLayers() const { return Asks(OutputSwitch::kLayerGates) || Asks(OutputSwitch::kLayerAttention); }
  // Whether anything per token is asked for (the answer then keeps its tokens).
  bool AsksPerToken() const {
    return Asks(OutputSwitch::kTokens) || Asks(OutputSwitch::kAttention) || Asks(OutputSwitch::kGates) || AsksLayers();
  }
};

struct InferenceResponse;

struct InferenceRequest {
  std::string model;
  int64_t version = 0;  // 0 = newest ready
  std::vector<std::string> texts;
  OutputOptions options;
  std::string request_id;
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
};

struct TokenOutput {
  TextToken token;
  int64_t id = 0;
  std::optional<float> attention;
  std::optional<float> gate;
  std::optional<float> sentence_attention;
  std::optional<float> sentence_gate;
  std::optional<float> lambda_q;
  std::optional<float> lambda_k;
  std::string tag;
};

struct SpanOutput {
  std::string label;
  uint32_t start = 0, end = 0;  // code points
  uint32_t byte_start = 0, byte_end = 0;
  uint32_t token_start = 0, token_end = 0;
  std::string text;
  float score = 0;
};

struct LayerMapOutput {
  int layer = -1;
  int head = -1;
  std::vector<float> gates, lambda_q, lambda_k;
  std::vector<float> attention;  // T x T, row-major
};

// options.faithfulness's answer: the top label's probability as answered and without α's top tokens.
struct FaithfulnessCheckOutput {
  std::string label;
  float score = 0;
  float score_without = 0;
  std::vector<uint32_t> removed;  // token indices, ascending
};

struct TextResult {
  std::vector<std::pair<std::string, float>> labels;  // classification, best first
  std::vector<SpanOutput> spans;                      // tagging
  std::vector<TokenOutput> tokens;
  bool truncated = false;
  uint32_t num_tokens = 0;
  std::vector<LayerMapOutput> layers;
  std::optional<FaithfulnessCheckOutput> faithfulness;
};

struct InferenceResponse {
  std::string model;
  int64_t version = 0;
  // The manifest of the version that answered (its labels, tags and outputs), held with the version.
  std::shared_ptr<const Manifest> manifest;
  std::vector<TextResult> results;
  std::string request_id;
  // For the access log and metrics: tokens fed to the model (after truncation), when its first text
  // joined the batch queue (the core's clock), the longest wait of its texts there, and the longest
  // batch it was in, whole and split into the forward pass and the post-processing of the rows.
  int64_t tokens = 0;
  absl::Time queued_at = absl::InfiniteFuture();
  absl::Duration queue_time;
  absl::Duration compute_time;
  absl::Duration forward_time;
  absl::Duration postprocess_time;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SPEC_REQUEST_H_

// A whole ModelInfer request of the Open Inference Protocol from the wire: the bytes walked and parsed
// as a ModelInferRequest (as the server's raw handler does, server/grpc/wire/wire_scan.h), which must
// refuse with a bounded message or hold at most 4 times the wire size plus the caps' elements
// (SpaceUsedLong), and read against a classifier's manifest
// with per-layer outputs. Whatever the bytes, the reading answers OK or INVALID_ARGUMENT with a
// message of bounded length. When it answers OK, an answer is made up for the texts it read, and
// AnswerBytes must bound the size of what ToModelInfer then builds (the server refuses answers over
// the send limit by AnswerBytes, before building them).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "server/frontend/oip/tensors.h"
#include "server/grpc/wire/wire_scan.h"

namespace {
void Check(bool ok) {
  if (!ok) std::abort();
}

std::shared_ptr<const qvi::Manifest> MakeManifest() {
  auto m = std::make_shared<qvi::Manifest>();
  m->name = "m";
  m->task = qvi::Task::kClassification;
  m->labels = {"neg", "pos", "neu"};
  m->outputs = {{"logits", {}}, {"attention", {}}, {"gates", {}}, {"layer_attention", {}}, {"layer_gates", {}}};
  m->layers = 2;
  m->heads = 2;
  m->tokenizer.max_tokens = 16;
  return m;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<const qvi::Manifest> manifest = MakeManifest();
  static const qvi::WireCaps caps = qvi::DefaultWireCaps(qvi::RequestLimits{});
  inference::ModelInferRequest request;
  if (absl::Status d = qvi::DecodeRequest(data, size, caps, &request); !d.ok()) {
    Check(d.code() == absl::StatusCode::kInvalidArgument && d.message().size() < 600);
    return 0;
  }
  // The caps' elements at their most (16 inputs, 64 outputs, 3 x 64 parameters, 256 texts...) fit in 512 KiB.
  Check(request.SpaceUsedLong() <= 4 * size + (512 << 10));
  absl::StatusOr<qvi::oip::InferPlan> plan = qvi::oip::FromModelInfer(request, *manifest, qvi::ServingConfig{});
  if (!plan.ok()) {
    Check(plan.status().code() == absl::StatusCode::kInvalidArgument);
    Check(plan.status().message().size() < 600);
    return 0;
  }
  Check(plan->request.texts.size() <= size);
  // A made-up answer: every label, a token per byte of each text (at most max_tokens), one layer map
  // per requested layer (at most 4).
  qvi::InferenceResponse answer;
  answer.model = "m";
  answer.version = 1;
  answer.manifest = manifest;
  const size_t maps =
      plan->request.options.AsksLayers() ? std::min<size_t>(4, plan->request.options.layers.layers.size() + 1) : 0;
  for (const std::string& text : plan->request.texts) {
    qvi::TextResult r;
    r.labels = {{"pos", 0.5f}, {"neg", 0.3f}, {"neu", 0.2f}};
    const size_t t = std::min<size_t>(text.size(), 16);
    r.num_tokens = static_cast<uint32_t>(text.size());
    r.truncated = text.size() > 16;
    for (size_t i = 0; i < t; ++i) {
      qvi::TokenOutput token;
      token.token.text = text.substr(i, 1);
      if (plan->request.options.Asks(qvi::OutputSwitch::kAttention)) token.attention = 0.1f;
      if (plan->request.options.Asks(qvi::OutputSwitch::kGates)) token.gate = 0.5f;
      r.tokens.push_back(token);
    }
    for (size_t l = 0; l < maps; ++l) {
      qvi::LayerMapOutput map;
      map.layer = static_cast<int>(l);
      if (plan->request.options.Asks(qvi::OutputSwitch::kLayerGates)) map.gates.assign(t, 0.5f);
      if (plan->request.options.Asks(qvi::OutputSwitch::kLayerAttention)) map.attention.assign(t * t, 0.1f);
      r.layers.push_back(map);
    }
    answer.results.push_back(std::move(r));
  }
  const int64_t bound = qvi::oip::AnswerBytes(answer, *plan);
  if (bound > (int64_t{64} << 20)) return 0;  // the server would refuse it unbuilt
  inference::ModelInferResponse out;
  qvi::oip::ToModelInfer(answer, *plan, request.id(), &out);
  int64_t raw = 0;
  for (const std::string& r : out.raw_output_contents()) raw += static_cast<int64_t>(r.size());
  Check(raw <= bound);
  Check(out.outputs_size() == static_cast<int>(plan->outputs.size()));
  return 0;
}

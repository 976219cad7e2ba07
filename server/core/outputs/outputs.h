// The catalogue of outputs: every output a model computes or an answer carries, one row each, in one
// table (outputs.cc). The core, the native API, the Open Inference Protocol and the explanation
// report all read it: an output's name on every wire, its kind, the request option that turns it
// on, the shape of the model's tensor, the datatype and shape of its wire tensor, and the answer
// field it fills are written once, there.
//
// An output is named by the enum below everywhere past the edge of the server: a request parses
// names into an OutputSet once, batches merge their sets, and names come back only when an answer
// is encoded. Adding an explanation output is one row here (with its TokenOutput or LayerMapOutput
// field and its proto field) plus the model side.
#ifndef QVI_SERVER_CORE_OUTPUTS_OUTPUTS_H_
#define QVI_SERVER_CORE_OUTPUTS_OUTPUTS_H_

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <vector>

#include "server/core/manifest/manifest.h"

namespace qvi {

struct TokenOutput;
struct LayerMapOutput;
struct AnswerView;
class TensorWriter;

// In the table's order, which is the order ModelMetadata lists them and a default answer carries them.
enum class Output : uint8_t {
  kLogits,             // model: [B,C] scores of the labels
  kEmissions,          // model: [B,T,K] scores of the tags
  kLabel,              // wire: the best label
  kProbabilities,      // wire: every label's probability (or, asked so, the K best as "score:index:label")
  kLabels,             // wire: the top_k labels, best first
  kScores,             // wire: their probabilities
  kSpans,              // wire: the entity spans as JSON
  kTags,               // model: [B,T] tag ids; wire: the tag names
  kTokens,             // wire: the tokens' texts
  kTokenCount,         // wire: how many tokens each text was read with
  kTruncated,          // wire: whether each text was cut at max_tokens
  kWordIndex,          // wire: a sub-word model's word of each token (-1: a special token; the word view: itself)
  kAttention,          // α, paper eq. 4
  kSentenceAttention,  // HAN: the sentence's α
  kGates,              // β, paper eq. 5
  kSentenceGates,      // HAN: the sentence's β
  kLambdaQ,            // context-aware self-attention: λ_Q, averaged over layers and heads
  kLambdaK,            // λ_K
  // options.contributions (classifiers with attention): each token's signed share of each returned
  // label's logit margin, the exact split of the pooled output the model computes (paper eq. 2/6)
  kContribution,          // model: [B,T,C] each token's share of each logit; wire: per returned label
  kSentenceContribution,  // HAN: the share of the token's sentence
  kMargin,                // wire: each returned label's logit less the mean of the other labels' logits
  kContributionRest,      // wire: the part of that margin no token carries (the output layer's bias)
  // options.occlusion (leave-one-out, from n more rows per text of its tokens less one; no model tensor)
  kOcclusion,        // classifier: each token's drop in each returned label's probability (N,K,T)
  kEntityOcclusion,  // tagger: each token's drop in each entity's probability (N,S,T)
  kLayerIndex,       // wire: (layer, head) of each per-layer map
  kLayerGates,       // per layer and head: β of eq. 9
  kLayerLambdaQ,     // per layer and head: λ_Q
  kLayerLambdaK,     // per layer and head: λ_K
  kLayerAttention,   // per layer and head: the self-attention map
  // The per-answer faithfulness check (options.faithfulness; OIP's faithfulness_top_k), per text:
  kFaithfulnessLabel,         // wire: the label checked (the answer's best)
  kFaithfulnessScore,         // wire: its probability as answered
  kFaithfulnessScoreWithout,  // wire: its probability with α's top tokens deleted
  kFaithfulnessRemoved,       // wire: the deleted tokens' indices, ascending, padded with -1
  // How far to trust a score (options.coverage, options.abstain_below; OIP's parameters of those names):
  kLabelSet,   // wire: each text's label set at the coverage asked for, as a JSON list, most probable first
  kAbstained,  // wire: whether each text's answer was marked abstained (a tagger's: in each span's JSON)
};
inline constexpr size_t kOutputCount = static_cast<size_t>(Output::kAbstained) + 1;

// A set of outputs: what a request asks for, what a batch computes, what a model has.
using OutputSet = std::bitset<kOutputCount>;

enum class OutputKind {
  kAnswer,       // the answer itself (labels, spans) or what it is made of
  kPerToken,     // one value per token
  kPerLayer,     // one value per token for each selected layer and head
  kPerLayerMap,  // a T x T map for each selected layer and head
};

// What puts an output into a request: its task's answer, a request option (the native API's
// OutputOptions field and the OIP parameter of the same name), or only naming it among OIP's outputs.
enum class OutputSwitch {
  kAnswer,          // always computed for its task, and in a default OIP answer
  kNamed,           // only when an OIP request names it
  kTokens,          // options.tokens
  kAnyToken,        // in a default OIP answer whenever the answer has tokens (token_count)
  kAttention,       // options.attention
  kGates,           // options.gates
  kAnyLayer,        // in a default OIP answer whenever it has per-layer outputs (layer_index)
  kLayerGates,      // options.layers.gates
  kLayerAttention,  // options.layers.attention_maps
  kContributions,   // options.contributions
  kOcclusion,       // options.occlusion
  kFaithfulness,    // options.faithfulness.top_k > 0 (OIP: the int64 parameter faithfulness_top_k)
  kCoverage,        // options.coverage set (OIP: the double parameter coverage)
  kAbstention,      // options.abstain_below set (OIP: the double parameter abstain_below)
};
inline constexpr size_t kOutputSwitchCount = static_cast<size_t>(OutputSwitch::kAbstention) + 1;

// Which tasks an output belongs to.
enum class TaskFilter { kBoth, kClassification, kTagging };

struct OutputRow;
// Writes the output's wire tensor for the answer in `view` (answer_tensors.cc); `classification` is
// OIP's classification parameter of the output (0: none).
using WriteTensor = void (*)(const AnswerView& view, const OutputRow& row, int classification, TensorWriter& out);
// At least the bytes of that tensor, without building it.
using TensorBytes = int64_t (*)(const AnswerView& view, const OutputRow& row, int classification);

struct OutputRow {
  Output id;
  const char* name;  // on every wire, in the manifest, and as the model's output name
  OutputKind kind;
  OutputSwitch on;
  TaskFilter task;
  // The model's tensor, when the model computes it: its symbolic shape (B batch, T tokens, C labels,
  // K tags, L layers, H heads) and whether it is int64 rather than floating point. Null otherwise.
  const char* model_shape;
  bool model_int64;
  // The wire tensor (OIP, gRPC and REST): datatype and symbolic shape (N texts, T the longest text's
  // tokens, C labels, K asked for (the labels returned), M maps, S the most entities of a text). Null
  // for outputs that never leave the server (logits).
  const char* wire_datatype;
  const char* wire_shape;
  // The model output that must be present for this output to exist (an explanation: itself;
  // layer_index: layer_attention; margin: contribution). nullopt: every model of its task has it.
  std::optional<Output> requires_output;
  // The answer field it fills: one value per token, or one vector per layer map.
  std::optional<float> TokenOutput::*token_field;
  std::vector<float> LayerMapOutput::*layer_field;
  // The field of the native API's Token or LayerMap that carries it (server/frontend/native/api.cc).
  const char* proto_field;
  // Or the answer field it fills with one value per token and returned label (the labels' order).
  std::vector<float> TokenOutput::*label_token_field;
  WriteTensor write;
  TensorBytes bytes;
};

// Every row, in the table's order.
const std::vector<OutputRow>& OutputCatalogue();
const OutputRow& Row(Output output);
inline const char* OutputName(Output output) { return Row(output).name; }
// The output with this name on the wire or in a manifest; nullopt when there is none.
std::optional<Output> OutputNamed(std::string_view name);

// The outputs a switch turns on.
OutputSet SwitchedBy(OutputSwitch on);
// Whether `set` holds any output of `on`.
inline bool AnySwitchedBy(const OutputSet& set, OutputSwitch on) { return (set & SwitchedBy(on)).any(); }
// The outputs of `kind`.
OutputSet OfKind(OutputKind kind);
// The model tensors of a task's answer (logits; or tags and emissions).
OutputSet AnswerTensors(Task task);
// The outputs of `set` that a model computes (those with a model_shape).
OutputSet ModelTensors(const OutputSet& set);
// Whether output `row` belongs to `task`.
bool ForTask(const OutputRow& row, Task task);

// A request option's names: the OIP parameter and the native API's field ("attention",
// "options.attention"; "layer_gates", "options.layers.gates"). Null for switches no option sets.
struct SwitchNames {
  const char* parameter;
  const char* option;
};
SwitchNames NamesOf(OutputSwitch on);
// The switch an OIP parameter of this name sets; nullopt when it is not one.
std::optional<OutputSwitch> SwitchParameter(std::string_view name);

// The set of these outputs.
OutputSet OutputsOf(std::initializer_list<Output> outputs);

// The outputs of `set`, in the table's order.
std::vector<Output> InOrder(const OutputSet& set);

// A model's outputs as the catalogue names them (its manifest's `outputs`).
inline bool HasOutput(const Manifest& m, Output output) { return m.HasOutput(OutputName(output)); }
// The catalogue's outputs the model computes.
OutputSet OutputsOfModel(const Manifest& m);
// Whether the model computes any of `set`'s outputs.
inline bool HasAny(const Manifest& m, const OutputSet& set) { return (OutputsOfModel(m) & set).any(); }

}  // namespace qvi

#endif  // QVI_SERVER_CORE_OUTPUTS_OUTPUTS_H_

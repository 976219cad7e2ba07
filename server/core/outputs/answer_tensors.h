// An answer as named tensors: the view the Open Inference Protocol gives of it (gRPC ModelInfer
// now, KServe v2 REST alike). Which tensors exist, which a request gets by default, how big they
// are and how each is written all come from the output catalogue (outputs.h): each wire output's row
// names its datatype, its shape and the function below that writes it.
//
// Tensors are written in OIP's raw layout: row-major, little-endian; a BYTES element is a 4-byte
// little-endian length and its bytes. T is the most tokens any text of the answer was read with;
// rows of shorter texts are padded with "" and 0.
#ifndef QVI_SERVER_CORE_OUTPUTS_ANSWER_TENSORS_H_
#define QVI_SERVER_CORE_OUTPUTS_ANSWER_TENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "server/core/manifest/manifest.h"
#include "server/core/outputs/answer.h"
#include "server/core/outputs/outputs.h"

namespace qvi {

// A tensor as ModelMetadata describes it: its name, datatype and shape (-1: any size).
struct TensorSpec {
  std::string name, datatype;
  std::vector<int64_t> shape;
};

// The one input: "text", BYTES [N], one UTF-8 text per element.
TensorSpec TextInput();
// Every wire output a model with this manifest can give, in the catalogue's order.
std::vector<TensorSpec> WireOutputs(const Manifest& manifest);
// Whether the model with this manifest has the wire output `output` (its task's, and the model
// output it needs present).
bool HasWireOutput(const Manifest& manifest, Output output);
// The outputs of an answer whose request named none: its task's answer, and what `asked` turns on
// that the model has, in the catalogue's order.
std::vector<Output> DefaultWireOutputs(const Manifest& manifest, const OutputSet& asked);

// What writing an answer's tensors needs, worked out once per answer.
struct AnswerView {
  explicit AnswerView(const InferenceResponse& answer, int top_k);
  // A view whose sizes bound those of the answer to come, before the model runs: `tokenised` holds
  // each text's tokens and nothing else yet. Labels and tags are taken at their longest, a span per
  // token (their texts together at most the text's), `layer_maps` maps per text.
  static AnswerView Before(const InferenceResponse& tokenised, int top_k, int64_t layer_maps);

  const InferenceResponse& answer;
  const Manifest& manifest;
  int64_t texts = 0;        // N
  int64_t max_tokens = 0;   // T
  int64_t layer_maps = 0;   // M: per-layer maps of each text (the same for all)
  int64_t max_spans = 0;    // S: the most entities any text has
  int top_k = 1;            // K of labels and scores
  int64_t label_bytes = 0;  // the longest label of any text
  int64_t token_bytes = 0, tag_bytes = 0, span_bytes = 0;
  std::map<std::string, int64_t> label_index;  // a label's position in the manifest's list
};

// One tensor being written: its datatype (the row's, unless the writer changes it), shape and raw
// contents.
class TensorWriter {
 public:
  TensorWriter(std::string datatype, std::string* raw) : datatype_(std::move(datatype)), raw_(raw) {}
  void SetDatatype(const char* datatype) { datatype_ = datatype; }
  void SetShape(std::vector<int64_t> shape) { shape_ = std::move(shape); }
  void Bytes(std::string_view element);
  void Float(float value);
  void Int32(int32_t value);
  void Bool(bool value) { raw_->push_back(value ? 1 : 0); }

  const std::string& datatype() const { return datatype_; }
  const std::vector<int64_t>& shape() const { return shape_; }

 private:
  std::string datatype_;
  std::vector<int64_t> shape_;
  std::string* raw_;
};

// Writes `output`'s tensor of the answer. May throw std::bad_alloc.
void WriteAnswerTensor(const AnswerView& view, Output output, int classification, TensorWriter& out);
// At least the bytes of that tensor (exact for the tensors; spans estimated from above), computed
// without building it, with 64 for its name, datatype and shape.
int64_t AnswerTensorBytes(const AnswerView& view, Output output, int classification);

// The catalogue's writers and sizes (outputs.cc puts them in the rows).
namespace tensors {
void Label(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t LabelBytes(const AnswerView& v, const OutputRow& row, int classification);
void Probabilities(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t ProbabilitiesBytes(const AnswerView& v, const OutputRow& row, int classification);
void TopLabels(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t TopLabelsBytes(const AnswerView& v, const OutputRow& row, int classification);
void TopScores(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t TopScoresBytes(const AnswerView& v, const OutputRow& row, int classification);
void Spans(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t SpansBytes(const AnswerView& v, const OutputRow& row, int classification);
void TagNames(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t TagNamesBytes(const AnswerView& v, const OutputRow& row, int classification);
void TokenTexts(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t TokenTextsBytes(const AnswerView& v, const OutputRow& row, int classification);
void TokenCount(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t PerTextBytes4(const AnswerView& v, const OutputRow& row, int classification);
void Truncated(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
// [N, T] INT32: a sub-word model's tokens' words (TokenOutput::word; a word's own index in the word
// view), -1 for special tokens and past a text's tokens.
void WordIndex(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t PerTextBytes1(const AnswerView& v, const OutputRow& row, int classification);
void PerToken(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t PerTokenBytes(const AnswerView& v, const OutputRow& row, int classification);
// [N, K, T]: each text's per-label token values (label_token_field) for its K returned labels, 0
// past a text's tokens or labels.
void PerLabelToken(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t PerLabelTokenBytes(const AnswerView& v, const OutputRow& row, int classification);
// [N, S, T]: options.occlusion of a tagger, each entity's drop per token (SpanOutput::occlusion), 0
// past a text's entities or tokens; S is the most entities any text has.
void EntityOcclusion(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t EntityOcclusionBytes(const AnswerView& v, const OutputRow& row, int classification);
// [N, K]: each returned label's margin, and the part of it no token carries.
void Margins(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
void ContributionRests(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t PerLabelBytes(const AnswerView& v, const OutputRow& row, int classification);
void LayerIndex(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t LayerIndexBytes(const AnswerView& v, const OutputRow& row, int classification);
void PerLayer(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t PerLayerBytes(const AnswerView& v, const OutputRow& row, int classification);
void PerLayerMap(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t PerLayerMapBytes(const AnswerView& v, const OutputRow& row, int classification);
// The faithfulness check, per text: "" and 0 for a text without one; faithfulness_removed is [N, R],
// R the most tokens any text's check deleted, each row padded with -1.
void FaithfulnessLabel(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
// options.coverage: each text's label set as a JSON list ("[\"sport\", \"business\"]"); options.abstain_below:
// whether each text's answer was marked abstained.
void LabelSets(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t LabelSetBytes(const AnswerView& v, const OutputRow& row, int classification);
void Abstained(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
void FaithfulnessScore(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
void FaithfulnessScoreWithout(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
void FaithfulnessRemoved(const AnswerView& v, const OutputRow& row, int classification, TensorWriter& out);
int64_t FaithfulnessRemovedBytes(const AnswerView& v, const OutputRow& row, int classification);
}  // namespace tensors

}  // namespace qvi

#endif  // QVI_SERVER_CORE_OUTPUTS_ANSWER_TENSORS_H_

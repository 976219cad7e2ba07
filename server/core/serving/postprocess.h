// Turns one text's slice of the model's outputs into the answer: top-k labels, tagged tokens and
// spans, per-token explanations, and per-layer maps. Pure functions over CPU tensors.
#ifndef QVI_SERVER_CORE_SERVING_POSTPROCESS_H_
#define QVI_SERVER_CORE_SERVING_POSTPROCESS_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "server/core/manifest/manifest.h"
#include "server/core/model/model_outputs.h"
#include "server/core/model/viterbi.h"
#include "server/core/request/request.h"

namespace qvi {

// The softmax of row `row` of `logits` [B,C], in float. Computed here over the row's
// memory, as torch's CPU kernel does (the maximum subtracted, then times 1/sum): a row's select,
// conversion and softmax through torch's dispatcher cost microseconds per request on the serving path
// (docs/performance.md, "Post-processing without torch"). A tensor that is not a CPU float one is
// converted first (a copy).
// At `temperature` T: the softmax of logits / T (the model card's calibration, Manifest::ScoreTemperature).
std::vector<float> SoftmaxRow(const at::Tensor& logits, int64_t row, double temperature = 1.0);

// A tagger's row of `n` tokens: p(tag k at token t) [n*K], the CRF's marginals (forward-backward) with
// every potential divided by `temperature`, or each token's softmax of its emissions / temperature
// without a CRF. The emission of (t, k) is emissions[t * token_stride + k * tag_stride].
std::vector<float> TagMarginals(const CrfScores* crf, const float* emissions, int64_t n, int64_t k,
                                int64_t token_stride, int64_t tag_stride, double temperature);
// An entity's probability: the mean over its tokens [start, end) of the marginal of the tag decoded there,
// marginals[(t - shift) * k + tags[t]] (shift 1: a row one token shorter before the entity).
float EntityProbability(const std::vector<float>& marginals, int64_t k, const std::vector<int64_t>& tags,
                        uint32_t start, uint32_t end, uint32_t shift = 0);

// The k best of `probs` (k = 0 means 1; k > C means all), best first, named by `labels`; ties go to
// the label listed first.
std::vector<std::pair<std::string, float>> TopK(const std::vector<float>& probs, const std::vector<std::string>& labels,
                                                int k);

// Tags of row `row` over the result's tokens and the spans they make; also sets TokenOutput::tag. Each
// span's score is its EntityProbability under `crf` (null: the model has none) at `temperature`; with
// `tag_probabilities` each token keeps its marginals too (TokenOutput::tag_probabilities).
void DecodeTagging(const Manifest& manifest, const at::Tensor& tags, const at::Tensor& emissions, int64_t row,
                   const std::string& text, TextResult& result, const CrfScores* crf, double temperature,
                   bool tag_probabilities = false);

// Fills the per-token explanations asked for from the [B,T] outputs present in `outputs`.
void FillTokenExplanations(const ModelOutputs& outputs, const OutputOptions& options, int64_t row, TextResult& result);
// options.contributions of a classifier's row whose labels are set: for each returned label y, its
// logit margin m_y = logit_y − mean of the other labels' logits, each token's share of it from the
// model's contribution output (share_y − mean of the others' shares; HAN: and its sentence's), and
// what no token carries, m_y − Σ shares (the output layer's bias, for the zoo's models).
void FillContributions(const Manifest& manifest, const ModelOutputs& outputs, int64_t row, TextResult& result);

// Per-layer maps of row `row` for its first `n` tokens: the per-layer outputs `options` asks for,
// selected and reduced as it says.
std::vector<LayerMapOutput> LayerMaps(const ModelOutputs& outputs, const OutputOptions& options, int64_t row,
                                      int64_t n);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_POSTPROCESS_H_

// options.occlusion: leave-one-out, served. Each text of n ≥ 2 tokens is run again n times, once
// without each of its tokens (deleted, the rest closed up: model_store/qvi/faithfulness.py's
// "delete" removal), as extra rows of the same request through the same batch queue; each token's
// value is how much what was answered drops without it:
//
//   Classify: p(y | x) − p(y | x ∖ i), for each returned label y.
//   Tag: for each entity, P(x) − P(x ∖ i), P the mean over the entity's tokens of the CRF marginal
//        probability of the tag decoded there (forward-backward over the emissions, CrfMarginals; a
//        tagger without a CRF: the softmax of the token's emissions, which are then its marginals);
//        the entity's own tokens are never deleted (0), and its positions shift left by one when a
//        token before it is.
// A sub-word model's tokens are its words (subwords.h): each variant deletes a whole word, and a
// tagger's rows are grouped into words before they are recorded.
//
// The record keeps what each row leaves (a classifier row's probabilities, a tagger row's marginals
// and decoded tags), one slot per row, each written by its own row's handler only; Fill reads them
// once every row is done (the request's completion orders the writes before it).
#ifndef QVI_SERVER_CORE_SERVING_OCCLUSION_H_
#define QVI_SERVER_CORE_SERVING_OCCLUSION_H_

#include <cstdint>
#include <vector>

#include "server/core/manifest/manifest.h"
#include "server/core/model/model_outputs.h"
#include "server/core/model/viterbi.h"
#include "server/core/outputs/answer.h"

namespace qvi {

// The variants of a text's token ids: for each token i (when there are at least two), the ids
// without it.
std::vector<std::vector<int64_t>> OcclusionVariantIds(const std::vector<int64_t>& ids);

class OcclusionRecord {
 public:
  // `tokens`: each text's token count, in the request's order; its variants follow the texts as
  // rows texts.size() + ..., text by text, token by token. `crf`: a tagger's CRF (it must outlive the
  // record), null for a classifier or a tagger without one. `words`: a sub-word model's words of each
  // text (tokens[i] of them), empty for other models. `temperature`: the answer's scores' (its labels'
  // and entities' probabilities are computed at it, as the answer's are).
  OcclusionRecord(const Manifest& manifest, const CrfScores* crf, const std::vector<int64_t>& tokens,
                  std::vector<std::vector<WordPieces>> words = {}, double temperature = 1.0);

  // The rows a request runs: its texts', then the variants'.
  int64_t rows() const { return static_cast<int64_t>(slots_.size()); }
  // Keeps what row `index` of the request (batch row `row` of `outputs`) leaves. Throws on outputs
  // that do not fit the model (a model file is untrusted input).
  void Record(int index, const ModelOutputs& outputs, int64_t row);
  // Fills text `text`'s occlusion into `result`, whose labels or spans are set: each token's value per
  // returned label (Classify; none for a text of one token), or each span's probability and values.
  void Fill(int text, TextResult& result) const;

 private:
  void RecordTags(int index, const ModelOutputs& outputs, int64_t row);
  void FillLabels(int text, TextResult& result) const;
  void FillSpans(int text, TextResult& result) const;
  // The tags' count K.
  int64_t Tags() const;
  // A sub-word model's words of row `index` (its text's, or without the word a variant deletes).
  std::vector<WordPieces> RowWords(int index) const;

  const Manifest& manifest_;
  const CrfScores* crf_;
  const double temperature_;
  std::vector<std::vector<WordPieces>> words_;  // per text, a sub-word model's
  std::vector<int64_t> tokens_;                 // per text
  std::vector<int64_t> first_;                  // per text: the row of its first variant (or -1)
  std::vector<int> owner_;                      // per row: the text it is (or is a variant of)
  std::vector<std::vector<float>> slots_;       // per row: probabilities, or marginals [n*K]
  std::vector<std::vector<int64_t>> tags_;      // per text (tagger): its decoded tag ids
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_OCCLUSION_H_

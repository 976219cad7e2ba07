// Viterbi decoding of a linear-chain CRF on the CPU: the recursion of qvi.nn.CRF.decode
// (model_store/qvi/nn/crf.py), step for step and in float32, so the tags agree with the model's own
// decode. Used by backends whose compiled model stops at the emissions (AOTInductor: torch.export
// cannot trace a loop over a dynamic number of tokens).
#ifndef QVI_SERVER_CORE_MODEL_VITERBI_H_
#define QVI_SERVER_CORE_MODEL_VITERBI_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "absl/status/statusor.h"

namespace qvi {

struct CrfScores {
  std::vector<float> start;        // [K]
  std::vector<float> end;          // [K]
  std::vector<float> transitions;  // [K*K], row = previous tag, column = next tag
  int num_tags() const { return static_cast<int>(start.size()); }
};

// emissions float [B,T,K], mask bool [B,T] (each row's real tokens a prefix), both on the CPU.
// Returns int64 [B,T]: the best path, -1 on padding. K must match the scores.
absl::StatusOr<at::Tensor> ViterbiDecode(const CrfScores& crf, const at::Tensor& emissions, const at::Tensor& mask);

// p(y_t = k | x) under the CRF for one text of `n` tokens (forward-backward in log space, in double),
// as model_store/qvi/faithfulness.py's crf_marginals computes it: element (t, k) of the result [n*K]
// is the marginal probability of tag k at token t. The emission of (t, k) is
// emissions[t * token_stride + k * tag_stride]. Empty for n = 0. At `temperature` T every potential
// (emissions, transitions, start and end scores) is divided by T (a model card's calibration).
std::vector<float> CrfMarginals(const CrfScores& crf, const float* emissions, int64_t n, int64_t token_stride,
                                int64_t tag_stride, double temperature = 1.0);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_VITERBI_H_

// Viterbi decoding of a linear-chain CRF on the CPU: the recursion of qvi.nn.CRF.decode
// (model_store/qvi/nn/crf.py), step for step and in float32, so the tags agree with the model's own
// decode. Used by backends whose compiled model stops at the emissions (AOTInductor: torch.export
// cannot trace a loop over a dynamic number of tokens).
#ifndef QVI_SERVER_CORE_MODEL_VITERBI_H_
#define QVI_SERVER_CORE_MODEL_VITERBI_H_

#include <torch/types.h>

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
absl::StatusOr<torch::Tensor> ViterbiDecode(const CrfScores& crf, const torch::Tensor& emissions,
                                            const torch::Tensor& mask);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_VITERBI_H_

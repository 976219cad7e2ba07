#include "server/core/model/viterbi.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qvi {

absl::StatusOr<at::Tensor> ViterbiDecode(const CrfScores& crf, const at::Tensor& emissions_in,
                                         const at::Tensor& mask_in) {
  const int k = crf.num_tags();
  if (emissions_in.dim() != 3 || emissions_in.size(2) != k || mask_in.dim() != 2 ||
      mask_in.size(0) != emissions_in.size(0) || mask_in.size(1) != emissions_in.size(1) ||
      crf.end.size() != static_cast<size_t>(k) || crf.transitions.size() != static_cast<size_t>(k) * k) {
    return absl::InternalError(absl::StrCat(
        "Viterbi: emissions of shape [", absl::StrJoin(emissions_in.sizes().vec(), ","), "] and mask of shape [",
        absl::StrJoin(mask_in.sizes().vec(), ","), "] do not fit a CRF of ", k, " tags"));
  }
  const at::Tensor emissions = emissions_in.to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor mask = mask_in.to(at::kCPU, at::kBool).contiguous();
  const int64_t b = emissions.size(0), t = emissions.size(1);
  at::Tensor tags = at::full({b, t}, -1, at::kLong);
  if (t == 0) return tags;
  const float* e = emissions.data_ptr<float>();
  const bool* m = mask.data_ptr<bool>();
  int64_t* out = tags.data_ptr<int64_t>();
  std::vector<float> score(k), next(k);
  std::vector<int64_t> history(static_cast<size_t>(std::max<int64_t>(t - 1, 0)) * k);
  for (int64_t row = 0; row < b; ++row) {
    const float* er = e + row * t * k;
    const bool* mr = m + row * t;
    int64_t length = 0;
    for (int64_t i = 0; i < t; ++i) length += mr[i];
    for (int j = 0; j < k; ++j) score[j] = crf.start[j] + er[j];
    for (int64_t i = 1; i < t; ++i) {
      int64_t* idx = history.data() + (i - 1) * k;
      for (int to = 0; to < k; ++to) {
        float best = score[0] + crf.transitions[to];
        int64_t arg = 0;
        for (int from = 1; from < k; ++from) {
          const float v = score[from] + crf.transitions[from * k + to];
          if (v > best) {  // first maximum wins, as torch.max's index does
            best = v;
            arg = from;
          }
        }
        idx[to] = arg;
        next[to] = best + er[i * k + to];
      }
      if (mr[i]) score.swap(next);
    }
    int64_t cur = 0;
    float best = score[0] + crf.end[0];
    for (int j = 1; j < k; ++j) {
      const float v = score[j] + crf.end[j];
      if (v > best) {
        best = v;
        cur = j;
      }
    }
    for (int64_t i = t - 1; i >= 0; --i) {
      const bool active = i < length;
      if (active) out[row * t + i] = cur;
      if (i > 0 && active) cur = history[(i - 1) * k + cur];
    }
  }
  return tags;
}

namespace {
// log Σ exp(x_i) over `count` values.
double LogSumExp(const double* x, int count) {
  double max = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < count; ++i) max = std::max(max, x[i]);
  if (!std::isfinite(max)) return max;
  double sum = 0;
  for (int i = 0; i < count; ++i) sum += std::exp(x[i] - max);
  return max + std::log(sum);
}
}  // namespace

std::vector<float> CrfMarginals(const CrfScores& crf, const float* emissions, int64_t n, int64_t token_stride,
                                int64_t tag_stride, double temperature) {
  const int k = crf.num_tags();
  std::vector<float> out(static_cast<size_t>(n) * k);
  if (n == 0 || k == 0) return out;
  const double inverse = 1.0 / temperature;  // 1: the potentials as they are, to the bit
  auto emission = [&](int64_t t, int j) {
    return static_cast<double>(emissions[t * token_stride + j * tag_stride]) * inverse;
  };
  auto trans = [&](int from, int to) {
    return static_cast<double>(crf.transitions[static_cast<size_t>(from) * k + to]) * inverse;
  };
  auto start = [&](int j) { return static_cast<double>(crf.start[j]) * inverse; };
  auto end = [&](int j) { return static_cast<double>(crf.end[j]) * inverse; };
  // alpha[t][j]: log Σ over paths ending in j at t; beta[t][j]: log Σ over the continuations from j at t.
  std::vector<double> alpha(static_cast<size_t>(n) * k), beta(static_cast<size_t>(n) * k), terms(k);
  for (int j = 0; j < k; ++j) alpha[j] = start(j) + emission(0, j);
  for (int64_t t = 1; t < n; ++t) {
    for (int to = 0; to < k; ++to) {
      for (int from = 0; from < k; ++from) terms[from] = alpha[(t - 1) * k + from] + trans(from, to);
      alpha[t * k + to] = LogSumExp(terms.data(), k) + emission(t, to);
    }
  }
  for (int j = 0; j < k; ++j) beta[(n - 1) * k + j] = end(j);
  for (int64_t t = n - 2; t >= 0; --t) {
    for (int from = 0; from < k; ++from) {
      for (int to = 0; to < k; ++to) terms[to] = trans(from, to) + emission(t + 1, to) + beta[(t + 1) * k + to];
      beta[t * k + from] = LogSumExp(terms.data(), k);
    }
  }
  for (int j = 0; j < k; ++j) terms[j] = alpha[(n - 1) * k + j] + end(j);
  const double log_z = LogSumExp(terms.data(), k);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(std::exp(alpha[i] + beta[i] - log_z));
  return out;
}

}  // namespace qvi

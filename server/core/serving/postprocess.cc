#include "server/core/serving/postprocess.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "server/core/text/spans.h"

namespace qvi {

namespace {

// `t` when it already is a CPU tensor of `type`, else a converted copy: its rows are then read through
// their strides, with no torch operation per row.
at::Tensor OnCpuAs(const at::Tensor& t, at::ScalarType type) {
  return t.device().is_cpu() && t.scalar_type() == type ? t : t.to(at::kCPU, type);
}

void CheckDims(const at::Tensor& t, int64_t dims, const char* what) {
  if (t.dim() != dims) {
    throw std::invalid_argument(std::string(what) + " has " + std::to_string(t.dim()) + " dimensions, not " +
                                std::to_string(dims));
  }
}

// Row `row` of [B,T,...] `t` exists and holds `tokens` tokens.
void CheckRow(const at::Tensor& t, int64_t row, int64_t tokens, const char* what) {
  if (row < 0 || row >= t.size(0) || tokens > t.size(1)) {
    throw std::out_of_range(std::string(what) + " of shape " + c10::str(t.sizes()) + " have no row " +
                            std::to_string(row) + " of " + std::to_string(tokens) + " tokens");
  }
}

// Softmax over the `count` values x[i * stride], as torch's CPU kernel computes it: the maximum
// subtracted, then times 1/sum. softmax(x)[i] = At(x[i * stride]).
// At inverse temperature `inverse` (1: the plain softmax, to the bit).
struct Softmax {
  Softmax(const float* x, int64_t count, int64_t stride, float inverse = 1.0F) : inverse(inverse) {
    for (int64_t i = 0; i < count; ++i) max = std::max(max, x[i * stride] * inverse);
    float sum = 0;
    for (int64_t i = 0; i < count; ++i) sum += std::exp(x[i * stride] * inverse - max);
    scale = 1.0F / sum;
  }
  float At(float value) const { return std::exp(value * inverse - max) * scale; }
  float inverse;
  float max = -std::numeric_limits<float>::infinity(), scale = 0;
};

}  // namespace

std::vector<float> SoftmaxRow(const at::Tensor& logits, int64_t row, double temperature) {
  const at::Tensor t = OnCpuAs(logits, at::kFloat);
  CheckDims(t, 2, "logits");
  CheckRow(t, row, 0, "logits");
  const float* x = t.data_ptr<float>() + row * t.stride(0);
  const int64_t count = t.size(1), stride = t.stride(1);
  const Softmax softmax(x, count, stride, static_cast<float>(1.0 / temperature));
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[i] = softmax.At(x[i * stride]);
  return out;
}

std::vector<float> TagMarginals(const CrfScores* crf, const float* emissions, int64_t n, int64_t k,
                                int64_t token_stride, int64_t tag_stride, double temperature) {
  if (crf != nullptr) return CrfMarginals(*crf, emissions, n, token_stride, tag_stride, temperature);
  std::vector<float> out(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t) {
    const float* x = emissions + t * token_stride;
    const Softmax softmax(x, k, tag_stride, static_cast<float>(1.0 / temperature));
    for (int64_t j = 0; j < k; ++j) out[static_cast<size_t>(t * k + j)] = softmax.At(x[j * tag_stride]);
  }
  return out;
}

float EntityProbability(const std::vector<float>& marginals, int64_t k, const std::vector<int64_t>& tags,
                        uint32_t start, uint32_t end, uint32_t shift) {
  double sum = 0;
  for (uint32_t t = start; t < end; ++t) {
    const int64_t tag = std::clamp<int64_t>(tags.at(t), 0, k - 1);
    sum += marginals.at(static_cast<size_t>((t - shift) * k + tag));
  }
  return end > start ? static_cast<float>(sum / (end - start)) : 0.0F;
}

std::vector<std::pair<std::string, float>> TopK(const std::vector<float>& probs, const std::vector<std::string>& labels,
                                                int k) {
  const int c = static_cast<int>(std::min(probs.size(), labels.size()));
  std::vector<int> order(c);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&probs](int a, int b) { return probs[a] > probs[b]; });
  const int keep = k <= 0 ? std::min(1, c) : std::min(k, c);
  std::vector<std::pair<std::string, float>> out;
  out.reserve(keep);
  for (int i = 0; i < keep; ++i) out.emplace_back(labels[order[i]], probs[order[i]]);
  return out;
}

void DecodeTagging(const Manifest& manifest, const at::Tensor& tags, const at::Tensor& emissions, int64_t row,
                   const std::string& text, TextResult& result, const CrfScores* crf, double temperature,
                   bool tag_probabilities) {
  const int64_t n = static_cast<int64_t>(result.tokens.size());
  const at::Tensor tag_all = OnCpuAs(tags, at::kLong), emission_all = OnCpuAs(emissions, at::kFloat);
  CheckDims(tag_all, 2, "tags");
  CheckDims(emission_all, 3, "emissions");
  CheckRow(tag_all, row, n, "tags");
  CheckRow(emission_all, row, n, "emissions");
  if (emission_all.size(2) == 0) throw std::invalid_argument("emissions have no tags");
  const int64_t* tag_row = tag_all.data_ptr<int64_t>() + row * tag_all.stride(0);
  const int64_t tag_step = tag_all.stride(1);
  const int64_t k = emission_all.size(2), emission_step = emission_all.stride(2);
  const float* emission_row = emission_all.data_ptr<float>() + row * emission_all.stride(0);
  if (crf != nullptr && crf->num_tags() != k) {
    throw std::invalid_argument("emissions of " + std::to_string(k) + " tags for a CRF of " +
                                std::to_string(crf->num_tags()));
  }
  // One confidence per entity, the same as options.occlusion's (occlusion.h): its EntityProbability.
  const std::vector<float> marginals =
      TagMarginals(crf, emission_row, n, k, emission_all.stride(1), emission_step, temperature);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::vector<std::string> names(n);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t id = tag_row[t * tag_step];
    ids[static_cast<size_t>(t)] = id;
    names[t] = (id >= 0 && id < static_cast<int64_t>(manifest.tags.size())) ? manifest.tags[id] : "O";
    result.tokens[t].tag = names[t];
    if (tag_probabilities) {
      result.tokens[t].tag_probabilities.assign(marginals.begin() + t * k, marginals.begin() + (t + 1) * k);
    }
  }
  for (const TagSpan& s : DecodeSpans(names)) {
    SpanOutput span;
    span.label = s.type;
    const TextToken& first = result.tokens[s.start].token;
    const TextToken& last = result.tokens[s.end - 1].token;
    span.start = first.start;
    span.end = last.end;
    span.byte_start = first.byte_start;
    span.byte_end = last.byte_end;
    span.token_start = static_cast<uint32_t>(s.start);
    span.token_end = static_cast<uint32_t>(s.end);
    span.text = text.substr(span.byte_start, span.byte_end - span.byte_start);
    span.score = EntityProbability(marginals, k, ids, span.token_start, span.token_end);
    result.spans.push_back(std::move(span));
  }
}

void FillTokenExplanations(const ModelOutputs& outputs, const OutputOptions& options, int64_t row, TextResult& result) {
  // Every per-token value of a switch the request turned on, that the batch computed.
  for (const OutputRow& r : OutputCatalogue()) {
    if (r.token_field == nullptr || !options.Asks(r.on) || !outputs.has(r.id)) continue;
    const at::Tensor all = OnCpuAs(outputs.at(r.id), at::kFloat);
    CheckDims(all, 2, "a per-token output");
    CheckRow(all, row, static_cast<int64_t>(result.tokens.size()), "a per-token output");
    const float* v = all.data_ptr<float>() + row * all.stride(0);
    const int64_t step = all.stride(1);
    for (size_t t = 0; t < result.tokens.size(); ++t) result.tokens[t].*r.token_field = v[t * step];
  }
}

namespace {

// x[y] less the mean of the other values x[i * stride], i < count (x[y] itself for one label).
float Margin(const float* x, int64_t count, int64_t stride, int64_t y) {
  if (count <= 1) return x[y * stride];
  double others = 0;
  for (int64_t i = 0; i < count; ++i) others += i == y ? 0.0 : x[i * stride];
  return static_cast<float>(x[y * stride] - others / static_cast<double>(count - 1));
}

}  // namespace

void FillContributions(const Manifest& manifest, const ModelOutputs& outputs, int64_t row, TextResult& result) {
  const at::Tensor logits = OnCpuAs(outputs.at(Output::kLogits), at::kFloat);
  CheckDims(logits, 2, "logits");
  CheckRow(logits, row, 0, "logits");
  const int64_t c = logits.size(1);
  std::vector<int64_t> labels;
  for (const auto& [label, score] : result.labels) {
    const auto at = std::find(manifest.labels.begin(), manifest.labels.end(), label);
    if (at == manifest.labels.end() || at - manifest.labels.begin() >= c) {
      throw std::out_of_range("label '" + label + "' has no logit");
    }
    labels.push_back(at - manifest.labels.begin());
  }
  const float* logit = logits.data_ptr<float>() + row * logits.stride(0);
  result.margins.clear();
  for (int64_t y : labels) result.margins.push_back(Margin(logit, c, logits.stride(1), y));
  const int64_t n = static_cast<int64_t>(result.tokens.size());
  for (Output output : {Output::kContribution, Output::kSentenceContribution}) {
    if (!outputs.has(output)) continue;
    const at::Tensor all = OnCpuAs(outputs.at(output), at::kFloat);
    CheckDims(all, 3, "contributions");
    CheckRow(all, row, n, "contributions");
    if (all.size(2) != c) throw std::invalid_argument("contributions have a different number of labels than logits");
    const float* v = all.data_ptr<float>() + row * all.stride(0);
    std::vector<float> TokenOutput::*field = Row(output).label_token_field;
    std::vector<double> carried(labels.size(), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float>& shares = result.tokens[static_cast<size_t>(t)].*field;
      shares.clear();
      for (size_t j = 0; j < labels.size(); ++j) {
        shares.push_back(Margin(v + t * all.stride(1), c, all.stride(2), labels[j]));
        carried[j] += shares.back();
      }
    }
    if (output != Output::kContribution) continue;
    result.contribution_rest.clear();
    for (size_t j = 0; j < labels.size(); ++j) {
      result.contribution_rest.push_back(static_cast<float>(result.margins[j] - carried[j]));
    }
  }
}

namespace {

std::vector<int64_t> Indices(const std::vector<int>& chosen, int64_t count) {
  std::vector<int64_t> out;
  if (chosen.empty()) {
    for (int64_t i = 0; i < count; ++i) out.push_back(i);
  } else {
    out.assign(chosen.begin(), chosen.end());
  }
  return out;
}

std::vector<float> ToVector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

}  // namespace

std::vector<LayerMapOutput> LayerMaps(const ModelOutputs& outputs, const OutputOptions& options, int64_t row,
                                      int64_t n) {
  const LayerSelection& selection = options.layers;
  // Each per-layer output present, for this row, cut to the text's tokens: [L,H,n] or [L,H,n,n].
  std::vector<std::pair<const OutputRow*, at::Tensor>> parts;
  int64_t layers = 0, heads = 0;
  outputs.ForEach([&](Output output, const at::Tensor& all) {
    const OutputRow& r = Row(output);
    if (r.layer_field == nullptr) return;
    at::Tensor t = all[row].slice(2, 0, n);
    if (t.dim() == 4) t = t.slice(3, 0, n);
    layers = t.size(0);
    heads = t.size(1);
    parts.emplace_back(&r, t);
  });
  // The batch may carry only some layers and heads (Model::Forward's OutputSelection): the original
  // index of each position is in layer_index / head_index.
  auto present = [](const at::Tensor& index, int64_t count) {
    if (!index.defined()) return Indices({}, count);
    const at::Tensor c = index.contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  };
  const std::vector<int64_t> have_layers = present(outputs.layer_index, layers),
                             have_heads = present(outputs.head_index, heads);
  // {-1}: the heads this request asked for were averaged on the device (Model::Forward).
  const bool averaged = have_heads == std::vector<int64_t>{-1};
  const std::vector<int64_t> ls = selection.layers.empty() ? have_layers : Indices(selection.layers, layers);
  const std::vector<int64_t> hs = selection.heads.empty() || averaged ? have_heads : Indices(selection.heads, heads);
  auto positions = [](const std::vector<int64_t>& wanted, const std::vector<int64_t>& have) {
    std::vector<int64_t> pos;
    for (int64_t w : wanted) pos.push_back(std::find(have.begin(), have.end(), w) - have.begin());
    return at::tensor(pos, at::kLong);
  };
  const at::Tensor li = positions(ls, have_layers), hi = positions(hs, have_heads);
  for (auto& [r, t] : parts) t = t.index_select(0, li).index_select(1, hi);  // [l,h,...]

  std::vector<LayerMapOutput> out;
  auto emit = [&](int layer, int head, const std::function<at::Tensor(const at::Tensor&)>& pick) {
    LayerMapOutput m;
    m.layer = layer;
    m.head = head;
    for (const auto& [r, t] : parts) {
      if (options.Asks(r->on)) m.*(r->layer_field) = ToVector(pick(t));
    }
    out.push_back(std::move(m));
  };
  using R = LayerSelection::Reduction;
  if (selection.reduction == R::kMeanAll) {
    emit(-1, -1, [](const at::Tensor& t) { return t.mean(std::vector<int64_t>{0, 1}); });
  } else {
    for (size_t a = 0; a < ls.size(); ++a) {
      if (selection.reduction == R::kMeanHeads) {
        emit(static_cast<int>(ls[a]), -1, [a](const at::Tensor& t) { return t[a].mean(0); });
        continue;
      }
      for (size_t b = 0; b < hs.size(); ++b) {
        emit(static_cast<int>(ls[a]), static_cast<int>(hs[b]), [a, b](const at::Tensor& t) { return t[a][b]; });
      }
    }
  }
  return out;
}

}  // namespace qvi

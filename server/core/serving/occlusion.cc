#include "server/core/serving/occlusion.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include "server/core/request/request_checks.h"
#include "server/core/serving/postprocess.h"
#include "server/core/serving/subwords.h"

namespace qvi {

std::vector<std::vector<int64_t>> OcclusionVariantIds(const std::vector<int64_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(OcclusionVariants(n)));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].reserve(ids.size() - 1);
    for (size_t t = 0; t < ids.size(); ++t) {
      if (t != i) out[i].push_back(ids[t]);
    }
  }
  return out;
}

OcclusionRecord::OcclusionRecord(const Manifest& manifest, const CrfScores* crf, const std::vector<int64_t>& tokens,
                                 std::vector<std::vector<WordPieces>> words, double temperature)
    : manifest_(manifest),
      crf_(crf),
      temperature_(temperature),
      words_(std::move(words)),
      tokens_(tokens),
      first_(tokens.size(), -1),
      tags_(tokens.size()) {
  if (!words_.empty() && words_.size() != tokens.size()) throw std::logic_error("occlusion: words of other texts");
  int64_t rows = static_cast<int64_t>(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (OcclusionVariants(tokens[i]) == 0) continue;
    first_[i] = rows;
    rows += OcclusionVariants(tokens[i]);
  }
  slots_.resize(static_cast<size_t>(rows));
  owner_.reserve(static_cast<size_t>(rows));
  for (size_t i = 0; i < tokens.size(); ++i) owner_.push_back(static_cast<int>(i));
  for (size_t i = 0; i < tokens.size(); ++i)
    owner_.insert(owner_.end(), OcclusionVariants(tokens[i]), static_cast<int>(i));
}

void OcclusionRecord::Record(int index, const ModelOutputs& outputs, int64_t row) {
  if (index < 0 || index >= rows()) throw std::out_of_range("occlusion: no row " + std::to_string(index));
  std::vector<float>& slot = slots_[static_cast<size_t>(index)];
  if (manifest_.task == Task::kClassification) {
    slot = SoftmaxRow(outputs.at(Output::kLogits), row, temperature_);
    return;
  }
  if (!words_.empty()) {  // a sub-word model's row, as its words
    const ModelOutputs words =
        FoldToWords(outputs, row, RowWords(index), OutputsOf({Output::kEmissions, Output::kTags}));
    RecordTags(index, words, 0);
    return;
  }
  RecordTags(index, outputs, row);
}

std::vector<WordPieces> OcclusionRecord::RowWords(int index) const {
  const int text = owner_[static_cast<size_t>(index)];
  std::vector<WordPieces> words = words_[static_cast<size_t>(text)];
  if (index < static_cast<int>(tokens_.size())) return words;
  const size_t deleted = static_cast<size_t>(index - first_[static_cast<size_t>(text)]);
  const uint32_t gap = words.at(deleted).end - words.at(deleted).first;
  words.erase(words.begin() + static_cast<std::ptrdiff_t>(deleted));
  for (size_t w = deleted; w < words.size(); ++w) {
    words[w].first -= gap;
    words[w].end -= gap;
  }
  return words;
}

int64_t OcclusionRecord::Tags() const {
  return crf_ != nullptr ? crf_->num_tags() : static_cast<int64_t>(manifest_.tags.size());
}

void OcclusionRecord::RecordTags(int index, const ModelOutputs& outputs, int64_t row) {
  std::vector<float>& slot = slots_[static_cast<size_t>(index)];
  // The row's tokens: its text's, or one fewer for a variant.
  const bool text = index < static_cast<int>(tokens_.size());
  const int64_t n = tokens_[static_cast<size_t>(owner_[static_cast<size_t>(index)])] - (text ? 0 : 1);
  const at::Tensor all = outputs.at(Output::kEmissions);
  const int64_t k = Tags();
  if (all.dim() != 3 || row < 0 || row >= all.size(0) || n > all.size(1) || all.size(2) != k) {
    throw std::invalid_argument("occlusion: emissions of shape " + c10::str(all.sizes()) + " do not fit row " +
                                std::to_string(row) + " of " + std::to_string(n) + " tokens and a CRF of " +
                                std::to_string(k) + " tags");
  }
  const at::Tensor e = all[row].to(at::kCPU, at::kFloat).contiguous();
  slot = TagMarginals(crf_, e.data_ptr<float>(), n, k, k, 1, temperature_);
  if (!text) return;
  const at::Tensor tags = outputs.at(Output::kTags)[row].to(at::kCPU, at::kLong).contiguous();
  if (tags.numel() < n) throw std::invalid_argument("occlusion: the tags do not cover the text");
  tags_[static_cast<size_t>(index)].assign(tags.data_ptr<int64_t>(), tags.data_ptr<int64_t>() + n);
}

void OcclusionRecord::Fill(int text, TextResult& result) const {
  if (text < 0 || text >= static_cast<int>(tokens_.size())) throw std::out_of_range("occlusion: no such text");
  if (manifest_.task == Task::kClassification) {
    FillLabels(text, result);
  } else {
    FillSpans(text, result);
  }
}

void OcclusionRecord::FillLabels(int text, TextResult& result) const {
  const int64_t first = first_[static_cast<size_t>(text)];
  if (first < 0) return;  // one token: nothing left to read without it
  const std::vector<float>& p = slots_[static_cast<size_t>(text)];
  std::vector<size_t> labels;
  for (const auto& [label, score] : result.labels) {
    const auto at = std::find(manifest_.labels.begin(), manifest_.labels.end(), label);
    if (at == manifest_.labels.end() || static_cast<size_t>(at - manifest_.labels.begin()) >= p.size()) {
      throw std::out_of_range("occlusion: label '" + label + "' has no probability");
    }
    labels.push_back(static_cast<size_t>(at - manifest_.labels.begin()));
  }
  const int64_t n = tokens_[static_cast<size_t>(text)];
  if (static_cast<int64_t>(result.tokens.size()) != n) throw std::logic_error("occlusion: the answer lost tokens");
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<float>& without = slots_[static_cast<size_t>(first + i)];
    if (without.size() != p.size()) throw std::logic_error("occlusion: a variant row was not recorded");
    std::vector<float>& values = result.tokens[static_cast<size_t>(i)].occlusion;
    values.clear();
    for (size_t y : labels) values.push_back(p[y] - without[y]);
  }
}

void OcclusionRecord::FillSpans(int text, TextResult& result) const {
  const int64_t n = tokens_[static_cast<size_t>(text)];
  const int64_t first = first_[static_cast<size_t>(text)];
  const std::vector<int64_t>& tags = tags_[static_cast<size_t>(text)];
  const std::vector<float>& marginals = slots_[static_cast<size_t>(text)];
  for (SpanOutput& span : result.spans) {
    if (span.token_end > n || span.token_start >= span.token_end) throw std::logic_error("occlusion: a span outside");
    const float p = EntityProbability(marginals, Tags(), tags, span.token_start, span.token_end);
    span.probability = p;
    span.occlusion.assign(static_cast<size_t>(n), 0.0F);
    if (first < 0) continue;
    for (int64_t i = 0; i < n; ++i) {
      if (i >= span.token_start && i < span.token_end) continue;  // the entity stays whole
      const std::vector<float>& without = slots_[static_cast<size_t>(first + i)];
      const uint32_t shift = i < span.token_start ? 1 : 0;
      span.occlusion[static_cast<size_t>(i)] =
          p - EntityProbability(without, Tags(), tags, span.token_start, span.token_end, shift);
    }
  }
}

}  // namespace qvi

#include "server/core/serving/shadow_compare.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <utility>

namespace qvi {
namespace {

// Ranks from 1, ties their mean rank.
std::vector<double> Ranks(const std::vector<double>& v) {
  std::vector<size_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> ranks(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    const double mean = (static_cast<double>(i) + static_cast<double>(j)) / 2.0 + 1.0;
    for (size_t k = i; k <= j; ++k) ranks[order[k]] = mean;
    i = j + 1;
  }
  return ranks;
}

std::optional<float> ScoreOf(const TextResult& r, const std::string& label) {
  for (const auto& [l, score] : r.labels) {
    if (l == label) return score;
  }
  return std::nullopt;
}

// The words' contributions to `label` (its index among the answer's labels), or none.
std::vector<double> Contributions(const TextResult& r, const std::string& label) {
  size_t k = r.labels.size();
  for (size_t i = 0; i < r.labels.size(); ++i) {
    if (r.labels[i].first == label) k = i;
  }
  std::vector<double> out;
  for (const TokenOutput& t : r.tokens) {
    if (k >= t.contribution.size()) return {};
    out.push_back(t.contribution[k]);
  }
  return out;
}

std::vector<double> Attention(const TextResult& r) {
  std::vector<double> out;
  for (const TokenOutput& t : r.tokens) {
    if (!t.attention) return {};
    out.push_back(*t.attention);
  }
  return out;
}

}  // namespace

std::optional<double> SpearmanCorrelation(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.size() < 2) return std::nullopt;
  const auto finite = [](double v) { return std::isfinite(v); };
  if (!std::all_of(a.begin(), a.end(), finite) || !std::all_of(b.begin(), b.end(), finite)) return std::nullopt;
  const std::vector<double> ra = Ranks(a), rb = Ranks(b);
  const double n = static_cast<double>(a.size());
  const double mean = (n + 1) / 2;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    cov += (ra[i] - mean) * (rb[i] - mean);
    va += (ra[i] - mean) * (ra[i] - mean);
    vb += (rb[i] - mean) * (rb[i] - mean);
  }
  if (va == 0 || vb == 0) return std::nullopt;
  return cov / std::sqrt(va * vb);
}

TextComparison CompareTexts(const TextResult& live, const TextResult& shadow) {
  TextComparison c;
  if (!live.labels.empty()) c.live_label = live.labels[0].first;
  if (!shadow.labels.empty()) c.shadow_label = shadow.labels[0].first;
  if (!c.live_label.empty()) {
    const std::optional<float> mine = ScoreOf(live, c.live_label), theirs = ScoreOf(shadow, c.live_label);
    if (mine && theirs && std::isfinite(*mine) && std::isfinite(*theirs)) {
      c.score_difference = static_cast<double>(*theirs) - static_cast<double>(*mine);
    }
  }
  c.live_spans = static_cast<int64_t>(live.spans.size());
  c.shadow_spans = static_cast<int64_t>(shadow.spans.size());
  std::vector<bool> matched(shadow.spans.size(), false);  // each of the candidate's spans matches once
  for (const SpanOutput& a : live.spans) {
    for (size_t k = 0; k < shadow.spans.size(); ++k) {
      const SpanOutput& b = shadow.spans[k];
      if (!matched[k] && std::tie(a.label, a.start, a.end) == std::tie(b.label, b.start, b.end)) {
        matched[k] = true;
        ++c.same_spans;
        break;
      }
    }
  }
  std::vector<double> mine = Contributions(live, c.live_label), theirs = Contributions(shadow, c.live_label);
  c.explained_by = "contributions";
  if (mine.empty() || theirs.empty()) {
    mine = Attention(live);
    theirs = Attention(shadow);
    c.explained_by = "attention";
  }
  c.rank_correlation = SpearmanCorrelation(mine, theirs);
  if (!c.rank_correlation) c.explained_by = "";
  return c;
}

}  // namespace qvi

#include "client/terminal.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include "client/faithfulness.h"

namespace qvi::client {
namespace v1 = serving::v1;

namespace {

// A token on a background whose intensity follows its weight (0..1): a 6-step ramp of the
// 256-colour palette from white to red (α) or to blue (β).
std::string Shade(const std::string& text, float weight, bool beta, bool color) {
  if (!color) return text;
  static const int kRed[] = {231, 224, 217, 210, 203, 196};
  static const int kBlue[] = {231, 195, 153, 111, 69, 27};
  const int step = std::clamp(static_cast<int>(weight * 5.0f + 0.5f), 0, 5);
  const int bg = beta ? kBlue[step] : kRed[step];
  return "\033[48;5;" + std::to_string(bg) + (step >= 4 ? "m\033[97m" : "m\033[30m") + text + "\033[0m";
}

// A token on a background of two colours for a signed share (-1..1 of the text's largest): green
// for a token that argues for the label, magenta for one that argues against it.
std::string ShadeSigned(const std::string& text, float share, bool color) {
  if (!color) return text;
  static const int kFor[] = {231, 194, 157, 120, 77, 28};
  static const int kAgainst[] = {231, 225, 219, 213, 170, 127};
  const int step = std::clamp(static_cast<int>(std::abs(share) * 5.0f + 0.5f), 0, 5);
  const int bg = share >= 0 ? kFor[step] : kAgainst[step];
  return "\033[48;5;" + std::to_string(bg) + (step >= 4 ? "m\033[97m" : "m\033[30m") + text + "\033[0m";
}

// Signed values over a text's tokens: a two-colour heat-map scaled to the largest (colour), else
// each token with its value; tokens in [skip_begin, skip_end) are shown in brackets, unscored.
std::string SignedLine(const google::protobuf::RepeatedPtrField<v1::Token>& tokens, const std::vector<float>& values,
                       bool color, uint32_t skip_begin = 0, uint32_t skip_end = 0) {
  float largest = 1e-9f;
  for (float v : values) largest = std::max(largest, std::abs(v));
  std::string line;
  for (int t = 0; t < tokens.size(); ++t) {
    const std::string& text = tokens[t].text();
    if (static_cast<uint32_t>(t) >= skip_begin && static_cast<uint32_t>(t) < skip_end) {
      line += "[" + text + "] ";
      continue;
    }
    const float v = t < static_cast<int>(values.size()) ? values[static_cast<size_t>(t)] : 0.0f;
    char number[32];
    std::snprintf(number, sizeof number, "(%+.2f)", v);
    line += (color ? ShadeSigned(text, v / largest, true) : text + number) + " ";
  }
  return line;
}

}  // namespace

// options.contributions: for each returned label, its tokens' shares of its margin as a heat-map
// with sign (colour) or as signed numbers after each token (no colour), and how the margin adds up.
void PrintContributions(const v1::Classification& r, bool color) {
  for (int j = 0; j < r.labels_size(); ++j) {
    const v1::LabelScore& l = r.labels(j);
    if (!l.has_margin()) continue;
    std::vector<float> shares;
    float carried = 0;
    for (const auto& t : r.tokens()) {
      shares.push_back(j < t.contribution_size() ? t.contribution(j) : 0.0f);
      carried += shares.back();
    }
    std::printf("  contribution to %s: margin %.4f = tokens %.4f + rest %.4f\n", l.label().c_str(), l.margin(), carried,
                l.contribution_rest());
    std::cout << "    " << SignedLine(r.tokens(), shares, color) << "\n";
  }
}

// options.occlusion of a classifier: for each returned label, how much its probability drops without
// each token (green: the label needs it; magenta: the label gains without it).
void PrintOcclusion(const v1::Classification& r, bool color) {
  for (int j = 0; j < r.labels_size(); ++j) {
    const std::vector<float> drops = LabelOcclusion(r, j);
    if (drops.empty()) return;
    std::printf("  occlusion of %s (p %.4f): the drop without each token\n", r.labels(j).label().c_str(),
                r.labels(j).score());
    std::cout << "    " << SignedLine(r.tokens(), drops, color) << "\n";
  }
}

// options.occlusion of a tagger: for each entity, how much its probability drops without each token
// around it (its own tokens, in brackets, stay).
void PrintEntityOcclusion(const v1::Tagging& r, bool color) {
  for (const auto& sp : r.spans()) {
    if (!sp.has_probability()) continue;
    std::printf("  why %s \"%s\" (p %.4f): the drop without each token\n", sp.label().c_str(), sp.text().c_str(),
                sp.probability());
    const std::vector<float> drops(sp.occlusion().begin(), sp.occlusion().end());
    std::cout << "    " << SignedLine(r.tokens(), drops, color, sp.token_start(), sp.token_end()) << "\n";
  }
}

void PrintTokens(const google::protobuf::RepeatedPtrField<v1::Token>& tokens, bool color) {
  float max_a = 1e-9f;
  bool any_a = false, any_b = false;
  for (const auto& t : tokens) {
    if (t.has_attention()) max_a = std::max(max_a, t.attention());
    any_a = any_a || t.has_attention();
    any_b = any_b || t.has_gate();
  }
  if (color && any_a) {  // α scaled to the text's largest weight, β as it is
    std::string line;
    for (const auto& t : tokens) line += Shade(t.text(), t.attention() / max_a, false, true) + " ";
    std::cout << "  α " << line << "\n";
  }
  if (color && any_b) {
    std::string line;
    for (const auto& t : tokens) line += Shade(t.text(), t.gate(), true, true) + " ";
    std::cout << "  β " << line << "\n";
  }
  for (const auto& t : tokens) {
    // A sub-word (options.subwords) as the vocabulary spells it ("##ing", "[CLS]"), with its word.
    std::printf("    %-18s [%u,%u)", (t.has_word() ? t.normalized() : t.text()).c_str(), t.start(), t.end());
    if (t.has_word()) std::printf("  word %d", t.word());
    if (!t.tag().empty()) std::printf("  %-14s", t.tag().c_str());
    if (t.has_attention()) std::printf("  α=%.4f", t.attention());
    if (t.has_gate()) std::printf("  β=%.4f", t.gate());
    if (t.has_lambda_q()) std::printf("  λq=%.4f λk=%.4f", t.lambda_q(), t.lambda_k());
    if (t.contribution_size() > 0) std::printf("  contribution=%+.4f", t.contribution(0));
    if (t.occlusion_size() > 0) std::printf("  occlusion=%+.4f", t.occlusion(0));
    std::printf("\n");
  }
}

namespace {

std::string Caption(const v1::LayerMap& m) {
  return (m.layer() < 0 ? std::string("all layers") : "layer " + std::to_string(m.layer())) + ", " +
         (m.head() < 0 ? std::string("mean of heads") : "head " + std::to_string(m.head()));
}

// "name: tok(0.52) tok(0.31) ..." over the text's tokens.
void PerToken(const char* name, const google::protobuf::RepeatedPtrField<v1::Token>& tokens,
              const google::protobuf::RepeatedField<float>& values) {
  if (values.empty()) return;
  std::string line;
  char number[32];
  for (int t = 0; t < tokens.size() && t < values.size(); ++t) {
    std::snprintf(number, sizeof number, "(%.2f) ", values[t]);
    line += tokens[t].text() + number;
  }
  std::printf("    %s: %s\n", name, line.c_str());
}

}  // namespace

void PrintLayers(const google::protobuf::RepeatedPtrField<v1::LayerMap>& layers,
                 const google::protobuf::RepeatedPtrField<v1::Token>& tokens) {
  const int n = tokens.size();
  for (const v1::LayerMap& m : layers) {
    std::printf("  %s\n", Caption(m).c_str());
    PerToken("β", tokens, m.gates());
    PerToken("λ_Q", tokens, m.lambda_q());
    PerToken("λ_K", tokens, m.lambda_k());
    if (m.attention_size() != n * n || n == 0) continue;
    // A T x T map does not fit a terminal: each query token with the three keys it attends to most.
    std::printf("    attention, each token's three most attended:\n");
    for (int q = 0; q < n; ++q) {
      std::vector<int> keys(static_cast<size_t>(n));
      for (int k = 0; k < n; ++k) keys[static_cast<size_t>(k)] = k;
      const int top = std::min(3, n);
      std::partial_sort(keys.begin(), keys.begin() + top, keys.end(),
                        [&](int a, int b) { return m.attention(q * n + a) > m.attention(q * n + b); });
      std::string line;
      char number[32];
      for (int i = 0; i < top; ++i) {
        const int k = keys[static_cast<size_t>(i)];
        std::snprintf(number, sizeof number, "(%.2f) ", m.attention(q * n + k));
        line += tokens[k].text() + number;
      }
      std::printf("      %-16s -> %s\n", tokens[q].text().c_str(), line.c_str());
    }
  }
}

void PrintClassification(const v1::Classification& r, bool show_tokens, double abstain_below, bool color) {
  for (const auto& l : r.labels()) std::printf("  %-12s %.4f\n", l.label().c_str(), l.score());
  if (r.has_label_set()) {
    std::string set;
    for (const std::string& label : r.label_set().labels()) set += (set.empty() ? "" : ", ") + label;
    std::printf("  set at coverage %g: {%s} (the labels at p >= %.4f)\n", r.label_set().coverage(), set.c_str(),
                r.label_set().min_probability());
  }
  if (r.abstained()) std::printf("  abstained: the top label's probability is below %g\n", abstain_below);
  if (r.truncated()) std::cout << "  (truncated: " << r.num_tokens() << " tokens, the model reads fewer)\n";
  if (r.has_faithfulness()) {
    const v1::FaithfulnessCheck& f = r.faithfulness();
    std::string removed;
    for (uint32_t t : f.removed()) {
      removed += (removed.empty() ? "" : " ") + (static_cast<int>(t) < r.tokens_size() ? r.tokens(t).text() : "?");
    }
    std::printf("  check: %s %.4f -> %.4f without α's top %d (%s)\n", f.label().c_str(), f.score(), f.score_without(),
                f.removed_size(), removed.c_str());
  }
  if (r.tokens_size() > 0) PrintContributions(r, color);
  if (r.tokens_size() > 0) PrintOcclusion(r, color);
  if (show_tokens) PrintTokens(r.tokens(), color);
  PrintLayers(r.layers(), r.tokens());
}

}  // namespace qvi::client

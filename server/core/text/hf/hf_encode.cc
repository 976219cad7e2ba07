// Encoding with a tokenizer.json (hf_pipeline_tokenizer.h): added tokens, normalizer, pre-tokenizer,
// model, post-processor -- as the reference does each.
#include <algorithm>
#include <iterator>

#include "server/core/text/hf/hf_pipeline_tokenizer.h"
#include "server/core/text/hf/hf_unicode.h"
#include "server/core/text/tokenizer.h"

namespace qvi::hf {

std::vector<std::tuple<size_t, size_t, int>> PipelineTokenizer::SplitAdded(const std::u32string& text) const {
  std::vector<std::tuple<size_t, size_t, int>> out;
  size_t start = 0;
  for (size_t i = 0; i < text.size() && !added_.empty();) {
    int match = -1;
    for (size_t a = 0; a < added_.size() && match < 0; ++a) {  // the longest first
      const std::u32string& c = added_[a].chars;
      if (c.size() <= text.size() - i &&
          std::equal(c.begin(), c.end(), text.begin() + static_cast<std::ptrdiff_t>(i))) {
        match = static_cast<int>(a);
      }
    }
    if (match < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = added_[static_cast<size_t>(match)];
    size_t begin = i, end = i + token.chars.size();
    while (token.lstrip && begin > start && IsWhitespace(text[begin - 1])) --begin;
    while (token.rstrip && end < text.size() && IsWhitespace(text[end])) ++end;
    if (begin > start) out.emplace_back(start, begin, -1);
    out.emplace_back(begin, end, match);
    start = i = end;
  }
  if (text.size() > start) out.emplace_back(start, text.size(), -1);
  return out;
}

namespace {

// `c` put before the text, aligned to the character it comes before, as the reference's prepend() does.
void Prepend(char32_t c, Normalized* n) {
  n->chars.insert(n->chars.begin(), c);
  n->from.insert(n->from.begin(), n->from[0]);
  n->to.insert(n->to.begin(), n->to[0]);
}

}  // namespace

Pieces PipelineTokenizer::SplitMetaspace(Normalized* n, size_t begin) const {
  Pieces pieces;
  const char32_t r = metaspace_->replacement;
  std::replace(n->chars.begin(), n->chars.end(), U' ', r);
  const bool prepend = metaspace_->prepend == Metaspace::Prepend::kAlways ||
                       (metaspace_->prepend == Metaspace::Prepend::kFirst && begin == 0);
  if (prepend && !n->chars.empty() && n->chars[0] != r) Prepend(r, n);
  if (!metaspace_->split) {
    if (!n->chars.empty()) pieces.emplace_back(0, n->chars.size());
    return pieces;
  }
  size_t start = 0;
  for (size_t i = 0; i < n->chars.size(); ++i) {  // each ▁ begins a piece
    if (n->chars[i] == r && i > start) {
      pieces.emplace_back(start, i);
      start = i;
    }
  }
  if (n->chars.size() > start) pieces.emplace_back(start, n->chars.size());
  return pieces;
}

Pieces PipelineTokenizer::PreTokenize(Normalized* n, size_t begin) const {
  Pieces pieces;
  if (byte_level_) {
    if (byte_level_->add_prefix_space && !n->chars.empty() && n->chars[0] != U' ') Prepend(U' ', n);
    if (byte_level_->use_regex) return SplitGpt2(n->chars, 0, n->chars.size());
    if (!n->chars.empty()) pieces.emplace_back(0, n->chars.size());
    return pieces;
  }
  if (metaspace_) return SplitMetaspace(n, begin);
  if (!n->chars.empty()) pieces.emplace_back(0, n->chars.size());
  for (PreTokenizeStep step : pre_tokenize_) pieces = Split(step, n->chars, pieces);
  return pieces;
}

void PipelineTokenizer::EncodeSegment(const std::u32string& chars, size_t begin, size_t end, int32_t* word,
                                      std::vector<SubwordToken>* out) const {
  Normalized n;
  n.chars = chars.substr(begin, end - begin);
  for (size_t i = begin; i < end; ++i) {
    n.from.push_back(static_cast<uint32_t>(i));
    n.to.push_back(static_cast<uint32_t>(i + 1));
  }
  for (const auto& normalize : normalize_) normalize(&n);
  const Pieces pieces = PreTokenize(&n, begin);
  std::vector<SubwordPiece> sub;
  for (const auto& [b, e] : pieces) {
    const Normalized piece = byte_level_ ? ToByteChars(n, b, e) : Normalized{};
    const Normalized& w = byte_level_ ? piece : n;
    const size_t base = byte_level_ ? 0 : b;
    sub.clear();
    model_->Tokenize(w.chars.substr(base, byte_level_ ? w.chars.size() : e - b), &sub);
    for (SubwordPiece& s : sub) {
      SubwordToken t;
      t.id = s.id;
      t.token = std::move(s.token);
      t.start = *std::min_element(w.from.begin() + static_cast<std::ptrdiff_t>(base + s.begin),
                                  w.from.begin() + static_cast<std::ptrdiff_t>(base + s.end));
      t.end = *std::max_element(w.to.begin() + static_cast<std::ptrdiff_t>(base + s.begin),
                                w.to.begin() + static_cast<std::ptrdiff_t>(base + s.end));
      t.word = *word;
      out->push_back(std::move(t));
    }
    ++*word;
  }
}

void PipelineTokenizer::TrimOffsets(std::vector<SubwordToken>* tokens) const {
  for (size_t i = 0; i < tokens->size(); ++i) {
    SubwordToken& t = (*tokens)[i];
    const std::u32string c = Decode(t.token);
    auto space = [](char32_t ch) { return ch == ByteChar(' ') || IsWhitespace(ch); };
    uint32_t leading = 0, trailing = 0;
    while (leading < c.size() && space(c[leading])) ++leading;
    while (trailing < c.size() && space(c[c.size() - 1 - trailing])) ++trailing;
    if (leading > 0) {
      // The space added before the first piece stays: it is the word's own start.
      if ((i == 0 || t.start == 0) && *trim_offsets_ && leading == 1) leading = 0;
      t.start = std::min(t.start + leading, t.end);
    }
    if (trailing > 0 && t.end >= trailing) t.end = std::max(t.end - trailing, t.start);
  }
}

absl::StatusOr<std::vector<SubwordToken>> PipelineTokenizer::Encode(std::string_view text,
                                                                    bool add_special_tokens) const {
  if (absl::Status valid = ValidateUtf8(text); !valid.ok()) return valid;
  const std::u32string chars = Decode(text);
  std::vector<SubwordToken> sequence;
  int32_t word = 0;
  for (const auto& [begin, end, added] : SplitAdded(chars)) {
    if (added < 0) {
      EncodeSegment(chars, begin, end, &word, &sequence);
      continue;
    }
    const AddedToken& a = added_[static_cast<size_t>(added)];
    sequence.push_back(
        SubwordToken{a.id, a.content, static_cast<uint32_t>(begin), static_cast<uint32_t>(end), 0, 0, word++, true});
  }
  if (trim_offsets_) TrimOffsets(&sequence);
  std::vector<uint32_t> byte_at(chars.size() + 1, 0);
  for (size_t i = 0; i < chars.size(); ++i) {
    byte_at[i + 1] = byte_at[i] + (chars[i] < 0x80 ? 1 : chars[i] < 0x800 ? 2 : chars[i] < 0x10000 ? 3 : 4);
  }
  for (SubwordToken& t : sequence) {
    t.byte_start = byte_at[t.start];
    t.byte_end = byte_at[t.end];
  }
  return add_special_tokens ? AddSpecialTokens(std::move(sequence)) : sequence;
}

std::vector<SubwordToken> PipelineTokenizer::AddSpecialTokens(std::vector<SubwordToken> sequence) const {
  if (template_.empty()) return sequence;
  std::vector<SubwordToken> out;
  out.reserve(sequence.size() + static_cast<size_t>(SpecialTokensAdded()));
  for (const TemplatePiece& piece : template_) {
    if (piece.sequence) {
      std::move(sequence.begin(), sequence.end(), std::back_inserter(out));
      continue;
    }
    for (size_t i = 0; i < piece.ids.size(); ++i) {
      SubwordToken t;
      t.id = piece.ids[i];
      t.token = piece.tokens[i];
      t.special = true;
      out.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace qvi::hf

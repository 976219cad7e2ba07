// Encoding with a WordPiece tokenizer.json (hf_wordpiece.h): added tokens, normalizer, pre-tokenizer,
// WordPiece's greedy longest match, the post-processor's special tokens -- as the reference does each.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/core/text/hf/hf_wordpiece.h"
#include "server/core/text/tokenizer.h"

namespace qvi::hf {

std::vector<std::tuple<size_t, size_t, int>> WordPieceTokenizer::SplitAdded(const std::u32string& text) const {
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
    if (i > start) out.emplace_back(start, i, -1);
    const size_t end = i + added_[static_cast<size_t>(match)].chars.size();
    out.emplace_back(i, end, match);
    start = i = end;
  }
  if (text.size() > start) out.emplace_back(start, text.size(), -1);
  return out;
}

void WordPieceTokenizer::TokenizeWord(const Normalized& n, size_t begin, size_t end, int32_t word,
                                      std::vector<SubwordToken>* out) const {
  auto token = [&](int64_t id, std::string text, size_t b, size_t e) {  // normalized [b, e) of the word
    SubwordToken t;
    t.id = id;
    t.token = std::move(text);
    t.start = *std::min_element(n.from.begin() + static_cast<std::ptrdiff_t>(b),
                                n.from.begin() + static_cast<std::ptrdiff_t>(e));
    t.end =
        *std::max_element(n.to.begin() + static_cast<std::ptrdiff_t>(b), n.to.begin() + static_cast<std::ptrdiff_t>(e));
    t.word = word;
    out->push_back(std::move(t));
  };
  const size_t chars = end - begin;
  if (chars > max_chars_) return token(unk_id_, unk_, begin, end);
  std::string utf8;
  std::vector<size_t> at(chars + 1);
  for (size_t k = 0; k < chars; ++k) {
    at[k] = utf8.size();
    AppendUtf8(n.chars[begin + k], &utf8);
  }
  at[chars] = utf8.size();
  const size_t first = out->size();
  for (size_t start = 0; start < chars;) {
    size_t stop = chars;
    for (; stop > start; --stop) {
      const absl::string_view piece(utf8.data() + at[start], at[stop] - at[start]);
      const auto& vocab = start == 0 || prefix_.empty() ? vocab_ : continuing_;  // no prefix: one vocabulary
      if (auto it = vocab.find(piece); it != vocab.end()) {
        token(it->second, start == 0 ? std::string(piece) : absl::StrCat(prefix_, piece), begin + start, begin + stop);
        break;
      }
    }
    if (stop == start) {  // no piece from here: the whole word is unknown
      out->resize(first);
      return token(unk_id_, unk_, begin, end);
    }
    start = stop;
  }
}

absl::StatusOr<std::vector<SubwordToken>> WordPieceTokenizer::Encode(std::string_view text,
                                                                     bool add_special_tokens) const {
  if (absl::Status valid = ValidateUtf8(text); !valid.ok()) return valid;
  const std::u32string chars = Decode(text);
  std::vector<uint32_t> byte_at(chars.size() + 1, 0);
  for (size_t i = 0, b = 0; i < chars.size(); ++i) {
    byte_at[i] = static_cast<uint32_t>(b);
    b += chars[i] < 0x80 ? 1 : chars[i] < 0x800 ? 2 : chars[i] < 0x10000 ? 3 : 4;
    byte_at[i + 1] = static_cast<uint32_t>(b);
  }
  std::vector<SubwordToken> sequence;
  int32_t word = 0;
  for (const auto& [begin, end, added] : SplitAdded(chars)) {
    if (added >= 0) {
      const AddedToken& a = added_[static_cast<size_t>(added)];
      SubwordToken t{a.id, a.content, static_cast<uint32_t>(begin), static_cast<uint32_t>(end), 0, 0, word++, true};
      sequence.push_back(std::move(t));
      continue;
    }
    Normalized n;
    n.chars = chars.substr(begin, end - begin);
    for (size_t i = begin; i < end; ++i) {
      n.from.push_back(static_cast<uint32_t>(i));
      n.to.push_back(static_cast<uint32_t>(i + 1));
    }
    for (NormalizeStep step : normalize_) Apply(step, &n);
    Pieces pieces;
    if (!n.chars.empty()) pieces.emplace_back(0, n.chars.size());
    for (PreTokenizeStep step : pre_tokenize_) pieces = Split(step, n.chars, pieces);
    for (const auto& [b, e] : pieces) TokenizeWord(n, b, e, word++, &sequence);
  }
  for (SubwordToken& t : sequence) {
    t.byte_start = byte_at[t.start];
    t.byte_end = byte_at[t.end];
  }
  if (!add_special_tokens || template_.empty()) return sequence;
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

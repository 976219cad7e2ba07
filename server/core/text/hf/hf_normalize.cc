// The normalizer and pre-tokenizer steps of hf_pipeline.h, each as the reference's component does it.
#include <algorithm>
#include <array>
#include <string>

#include "server/core/text/hf/hf_pipeline.h"
#include "server/core/text/hf/hf_unicode.h"

namespace qvi::hf {
namespace {

// Replaces each character by what `f` appends for it (nothing: removed), aligned to where it came from.
template <typename F>
void Rewrite(Normalized* text, F&& f) {
  Normalized out;
  out.chars.reserve(text->chars.size());
  out.from.reserve(text->chars.size());
  out.to.reserve(text->chars.size());
  for (size_t i = 0; i < text->chars.size(); ++i) {
    f(text->chars[i], &out.chars);
    out.from.resize(out.chars.size(), text->from[i]);
    out.to.resize(out.chars.size(), text->to[i]);
  }
  *text = std::move(out);
}

// NFD's canonical ordering: each run of marks (combining class above 0) sorted by class, stably. The
// alignments stay where they are, as the reference's (unicode-normalization-alignments) do: a mark
// moved before another takes that position's alignment.
void ReorderMarks(Normalized* text) {
  std::u32string& chars = text->chars;
  for (size_t i = 0; i < chars.size();) {
    if (CombiningClass(chars[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < chars.size() && CombiningClass(chars[j]) != 0) ++j;
    std::stable_sort(chars.begin() + static_cast<std::ptrdiff_t>(i), chars.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }
}

}  // namespace

void Apply(NormalizeStep step, Normalized* text) {
  switch (step) {
    case NormalizeStep::kClean:
      Rewrite(text, [](char32_t c, std::u32string* out) {
        if (c == 0 || c == 0xFFFD || IsRemovedByCleaning(c)) return;
        out->push_back(IsWhitespace(c) ? U' ' : c);
      });
      return;
    case NormalizeStep::kChinese:
      Rewrite(text, [](char32_t c, std::u32string* out) {
        if (IsChineseChar(c)) {
          out->append({U' ', c, U' '});
        } else {
          out->push_back(c);
        }
      });
      return;
    case NormalizeStep::kNfd:
      Rewrite(text, [](char32_t c, std::u32string* out) { AppendNfd(c, out); });
      ReorderMarks(text);
      return;
    case NormalizeStep::kStripNonspacing:
      Rewrite(text, [](char32_t c, std::u32string* out) {
        if (!IsNonspacingMark(c)) out->push_back(c);
      });
      return;
    case NormalizeStep::kStripCombining:
      Rewrite(text, [](char32_t c, std::u32string* out) {
        if (!IsCombiningMark(c)) out->push_back(c);
      });
      return;
    case NormalizeStep::kLowercase:
      Rewrite(text, [](char32_t c, std::u32string* out) { AppendLowercase(c, out); });
      return;
  }
}

Pieces Split(PreTokenizeStep step, const std::u32string& chars, const Pieces& pieces) {
  Pieces out;
  for (const auto& [begin, end] : pieces) {
    size_t start = begin;
    for (size_t i = begin; i < end; ++i) {
      const char32_t c = chars[i];
      if (step == PreTokenizeStep::kWhitespace && IsWhitespace(c)) {
        if (i > start) out.emplace_back(start, i);
        start = i + 1;
      } else if (step == PreTokenizeStep::kBertPunctuation && IsBertPunctuation(c)) {
        if (i > start) out.emplace_back(start, i);
        out.emplace_back(i, i + 1);
        start = i + 1;
      }
    }
    if (end > start) out.emplace_back(start, end);
  }
  return out;
}

namespace {

// 's|'t|'re|'ve|'m|'ll|'d at `p`: its length, or 0.
size_t Contraction(const std::u32string& t, size_t p, size_t end) {
  if (t[p] != U'\'' || p + 1 >= end) return 0;
  const char32_t a = t[p + 1], b = p + 2 < end ? t[p + 2] : 0;
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  return 0;
}

// \s+(?!\S), else \s+, at `p` (a space, to the pattern).
size_t Spaces(const std::u32string& t, size_t p, size_t end) {
  auto space = [](char32_t c) { return !IsRegexLetter(c) && !IsRegexNumber(c) && !IsRegexOther(c); };
  size_t q = p;
  while (q < end && space(t[q])) ++q;
  if (q == end || q - p == 1) return q - p;
  return q - p - 1;  // the last space goes with what follows it
}

// The length of the match of GPT-2's pattern at `p` (chars up to `end`): its alternatives in order,
// each greedy, as Oniguruma tries them.
size_t Gpt2Match(const std::u32string& t, size_t p, size_t end) {
  if (const size_t n = Contraction(t, p, end); n > 0) return n;
  for (bool (*in)(char32_t) : {IsRegexLetter, IsRegexNumber, IsRegexOther}) {  // ` ?\p{L}+` and the next two
    auto run = [&](size_t from) {
      size_t q = from;
      while (q < end && in(t[q])) ++q;
      return q;
    };
    if (t[p] == U' ' && p + 1 < end && in(t[p + 1])) return run(p + 1) - p;
    if (in(t[p])) return run(p) - p;
  }
  return Spaces(t, p, end);
}

}  // namespace

Pieces SplitGpt2(const std::u32string& chars, size_t begin, size_t end) {
  Pieces out;
  for (size_t p = begin; p < end;) {
    const size_t n = Gpt2Match(chars, p, end);
    out.emplace_back(p, p + n);
    p += n;
  }
  return out;
}

char32_t ByteChar(unsigned char b) {
  // GPT-2's table: the printable bytes stand for themselves, the others for U+0100 on, in byte order.
  static const std::array<char32_t, 256> kTable = [] {
    std::array<char32_t, 256> table{};
    char32_t next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      table[static_cast<size_t>(c)] = printable ? static_cast<char32_t>(c) : next++;
    }
    return table;
  }();
  return kTable[b];
}

Normalized ToByteChars(const Normalized& text, size_t begin, size_t end) {
  Normalized out;
  std::string utf8;
  for (size_t i = begin; i < end; ++i) {
    utf8.clear();
    AppendUtf8(text.chars[i], &utf8);
    for (unsigned char b : utf8) {
      out.chars.push_back(ByteChar(b));
      out.from.push_back(text.from[i]);
      out.to.push_back(text.to[i]);
    }
  }
  return out;
}

std::string Utf8(const std::u32string& chars, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) AppendUtf8(chars[i], &out);
  return out;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::u32string Decode(std::string_view utf8) {  // of text validated as UTF-8
  std::u32string out;
  for (size_t i = 0; i < utf8.size();) {
    const auto b = static_cast<unsigned char>(utf8[i]);
    const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t c = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(utf8[i + k]) & 0x3F);
    out.push_back(c);
    i += static_cast<size_t>(n);
  }
  return out;
}
}  // namespace qvi::hf

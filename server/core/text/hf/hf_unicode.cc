#include "server/core/text/hf/hf_unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <iterator>

namespace qvi::hf {
namespace {

struct CodePointRange {
  char32_t first;
  char32_t last;
};
struct CodePointMapping {
  char32_t cp;
  uint32_t at;
  uint32_t len;
};

#include "server/core/text/hf/hf_unicode_tables.inc"

template <size_t N>
bool InRanges(const CodePointRange (&ranges)[N], char32_t c) {
  const CodePointRange* end = ranges + N;
  const CodePointRange* it =
      std::upper_bound(ranges, end, c, [](char32_t v, const CodePointRange& r) { return v < r.first; });
  return it != ranges && c <= std::prev(it)->last;
}

template <size_t N, size_t P>
bool AppendMapped(const CodePointMapping (&rows)[N], const char32_t (&pool)[P], char32_t c, std::u32string* out) {
  const CodePointMapping* end = rows + N;
  const CodePointMapping* it =
      std::lower_bound(rows, end, c, [](const CodePointMapping& m, char32_t v) { return m.cp < v; });
  if (it == end || it->cp != c) return false;
  out->append(pool + it->at, pool + it->at + it->len);
  return true;
}

// Every property of the 128 ASCII code points, from the tables once: most text is mostly ASCII.
struct AsciiProperties {
  std::array<uint8_t, 128> bits{};
  AsciiProperties() {
    for (char32_t c = 0; c < 128; ++c) {
      bits[c] = static_cast<uint8_t>((InRanges(kRemoved, c) ? 1 : 0) | (InRanges(kWhitespace, c) ? 2 : 0) |
                                     (InRanges(kPunctuation, c) ? 4 : 0) | (InRanges(kRegexLetter, c) ? 8 : 0) |
                                     (InRanges(kRegexNumber, c) ? 16 : 0) | (InRanges(kRegexOther, c) ? 32 : 0));
    }
  }
};
const AsciiProperties kAscii;

constexpr char32_t kHangulFirst = 0xAC00, kHangulLast = 0xD7A3;

}  // namespace

bool IsRemovedByCleaning(char32_t c) { return c < 128 ? (kAscii.bits[c] & 1) != 0 : InRanges(kRemoved, c); }
bool IsWhitespace(char32_t c) { return c < 128 ? (kAscii.bits[c] & 2) != 0 : InRanges(kWhitespace, c); }
bool IsBertPunctuation(char32_t c) { return c < 128 ? (kAscii.bits[c] & 4) != 0 : InRanges(kPunctuation, c); }
bool IsNonspacingMark(char32_t c) { return c >= 0x300 && InRanges(kNonspacingMark, c); }
bool IsCombiningMark(char32_t c) { return c >= 0x300 && InRanges(kCombiningMark, c); }

bool IsRegexLetter(char32_t c) { return c < 128 ? (kAscii.bits[c] & 8) != 0 : InRanges(kRegexLetter, c); }
bool IsRegexNumber(char32_t c) { return c < 128 ? (kAscii.bits[c] & 16) != 0 : InRanges(kRegexNumber, c); }
bool IsRegexOther(char32_t c) { return c < 128 ? (kAscii.bits[c] & 32) != 0 : InRanges(kRegexOther, c); }

bool IsChineseChar(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void AppendNfd(char32_t c, std::u32string* out) {
  if (c < 0xC0) {
    out->push_back(c);
  } else if (c >= kHangulFirst && c <= kHangulLast) {  // the algorithm of Unicode's chapter 3.12
    const char32_t s = c - kHangulFirst;
    out->push_back(0x1100 + s / 588);
    out->push_back(0x1161 + (s % 588) / 28);
    if (s % 28 != 0) out->push_back(0x11A7 + s % 28);
  } else if (!AppendMapped(kNfd, kNfdPool, c, out)) {
    out->push_back(c);
  }
}

void AppendLowercase(char32_t c, std::u32string* out) {
  if (c < 128) {
    out->push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
  } else if (!AppendMapped(kLowercase, kLowercasePool, c, out)) {
    out->push_back(c);
  }
}

int CombiningClass(char32_t c) {
  return c < 0x300 ? 0 : utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class;
}

}  // namespace qvi::hf

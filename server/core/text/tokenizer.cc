#include "server/core/text/tokenizer.h"

#include <utf8proc.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qvi {
namespace {

constexpr int32_t kZwnj = 0x200C;
constexpr int32_t kZwj = 0x200D;

struct CodePoint {
  int32_t value;
  uint32_t byte_start;
  uint32_t byte_end;
};

// Python's str.isspace(): general category Zs, or bidirectional class WS, B or S.
bool IsSpaceSlow(int32_t cp) {
  const utf8proc_property_t* p = utf8proc_get_property(cp);
  return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

bool IsSeparatorSlow(int32_t cp) {
  const utf8proc_category_t c = utf8proc_category(cp);
  return IsSpaceSlow(cp) || c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF;
}

bool IsWordCharSlow(int32_t cp);

// ASCII, which most texts are mostly made of, classified once from utf8proc's own answers: the same
// tokens, without a property lookup per character (a third of tokenising short English texts).
struct AsciiTable {
  bool separator[128];
  bool word[128];
  AsciiTable() {
    for (int32_t cp = 0; cp < 128; ++cp) {
      separator[cp] = IsSeparatorSlow(cp);
      word[cp] = IsWordCharSlow(cp);
    }
  }
};
const AsciiTable kAscii;  // built at load; utf8proc's tables are static data

bool IsSeparator(int32_t cp) { return cp < 128 ? kAscii.separator[cp] : IsSeparatorSlow(cp); }

bool Attaches(int32_t cp) {
  if (cp < 128) return false;  // no ASCII character is a mark, a skin tone or ZWNJ
  const utf8proc_category_t c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME ||
         (cp >= 0x1F3FB && cp <= 0x1F3FF) || cp == kZwnj;
}

bool IsRegionalIndicator(int32_t cp) { return cp >= 0x1F1E6 && cp <= 0x1F1FF; }

bool IsCjk(int32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2EBEF) || (cp >= 0x30000 && cp <= 0x323AF) || (cp >= 0xF900 && cp <= 0xFAFF) ||
         (cp >= 0x2F800 && cp <= 0x2FA1F) || (cp >= 0x3040 && cp <= 0x309F) || (cp >= 0x30A0 && cp <= 0x30FF) ||
         (cp >= 0x31F0 && cp <= 0x31FF) || (cp >= 0xFF66 && cp <= 0xFF9D);
}

bool IsWordCharSlow(int32_t cp) {
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

bool IsWordChar(int32_t cp) { return cp < 128 ? kAscii.word[cp] : IsWordCharSlow(cp); }

// Calls `visit(code_point, first_byte, end_byte)` for each code point of `text`, in order; stops at
// the first byte that does not begin a well-formed one.
template <typename Visit>
absl::Status ForEachCodePoint(std::string_view text, Visit&& visit) {
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    if (bytes[i] < 0x80) {  // ASCII: one byte, always well-formed
      visit(static_cast<int32_t>(bytes[i]), i, i + 1);
      ++i;
      continue;
    }
    utf8proc_int32_t cp;
    const utf8proc_ssize_t n = utf8proc_iterate(bytes + i, static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    if (n <= 0 || cp < 0) return absl::InvalidArgumentError(absl::StrCat("invalid UTF-8 at byte ", i));
    visit(cp, i, i + static_cast<size_t>(n));
    i += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CodePoint>> Decode(std::string_view text) {
  // Sized once and written in place: push_back built each element on the stack and copied it, and
  // the copy's 8-byte load of three 4-byte stores stalled on store forwarding at every code point
  // (half of tokenising an ASCII text).
  std::vector<CodePoint> out(text.size());
  CodePoint* next = out.data();
  absl::Status s = ForEachCodePoint(text, [&next](int32_t cp, size_t first, size_t end) {
    next->value = cp;
    next->byte_start = static_cast<uint32_t>(first);
    next->byte_end = static_cast<uint32_t>(end);
    ++next;
  });
  if (!s.ok()) return s;
  out.resize(static_cast<size_t>(next - out.data()));
  return out;
}

void AppendUtf8(int32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
    return;
  }
  utf8proc_uint8_t buf[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(cp, buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

}  // namespace

// Decode's checks without its vector: a 16 MiB text is checked in place, allocating nothing.
absl::Status ValidateUtf8(std::string_view text) {
  return ForEachCodePoint(text, [](int32_t, size_t, size_t) {});
}

int CaseClass(std::string_view text) {
  int upper = 0, lower = 0;
  bool first_upper = false;
  // A token's text is valid UTF-8 (Tokenize checked it); a bad byte would only end the walk early.
  (void)ForEachCodePoint(text, [&](int32_t cp, size_t, size_t) {
    const utf8proc_category_t c = utf8proc_category(cp);
    if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT) {
      if (upper == 0 && lower == 0) first_upper = true;
      ++upper;
    } else if (c == UTF8PROC_CATEGORY_LL) {
      ++lower;
    }
  });
  if (upper == 0) return lower > 0 ? 1 : 0;
  if (upper == 1 && first_upper) return 2;
  return lower == 0 ? 3 : 4;
}

absl::StatusOr<std::vector<TextToken>> Tokenizer::Tokenize(std::string_view text) const {
  absl::StatusOr<std::vector<CodePoint>> decoded = Decode(text);
  if (!decoded.ok()) return decoded.status();
  const std::vector<CodePoint>& cps = *decoded;
  const size_t n = cps.size();

  std::vector<TextToken> tokens;
  tokens.reserve(n / 4 + 1);                    // about a word in five characters: one allocation for most texts
  auto emit = [&](size_t first, size_t last) {  // code points [first, last)
    TextToken t;
    t.start = static_cast<uint32_t>(first);
    t.end = static_cast<uint32_t>(last);
    t.byte_start = cps[first].byte_start;
    t.byte_end = cps[last - 1].byte_end;
    t.text.assign(text.substr(t.byte_start, t.byte_end - t.byte_start));
    if (options_.lowercase) {
      t.normalized.reserve(t.text.size());
      for (size_t k = first; k < last; ++k) {
        const int32_t cp = cps[k].value;
        AppendUtf8(cp < 128 ? (cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp) : utf8proc_tolower(cp), t.normalized);
      }
    } else {
      t.normalized = t.text;
    }
    tokens.push_back(std::move(t));
  };

  size_t word_start = 0;
  size_t word_end = 0;
  bool in_word = false;
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    const int32_t base = cps[i].value;
    ++i;
    const bool separator = IsSeparator(base);
    if (!separator) {  // rule 2: what attaches to the unit's base
      if (IsRegionalIndicator(base) && i < n && IsRegionalIndicator(cps[i].value)) ++i;
      while (i < n) {
        const int32_t cp = cps[i].value;
        if (Attaches(cp)) {
          ++i;
        } else if (cp == kZwj) {
          i += (i + 1 < n && !IsSeparator(cps[i + 1].value)) ? 2 : 1;
        } else {
          break;
        }
      }
    }
    const bool word = !separator && options_.level == TokenLevel::kWord && IsWordChar(base) && !IsCjk(base);
    if (word) {
      if (!in_word) word_start = start;
      in_word = true;
      word_end = i;
      continue;
    }
    if (in_word) {
      emit(word_start, word_end);
      in_word = false;
    }
    if (!separator) emit(start, i);
  }
  if (in_word) emit(word_start, word_end);
  return tokens;
}

}  // namespace qvi

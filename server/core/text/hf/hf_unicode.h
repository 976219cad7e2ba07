// The Unicode properties Hugging Face `tokenizers` tokenizes with (the version pinned in
// requirements-test.txt), read from the package itself by scripts/gen_hf_unicode.py into
// hf_unicode_tables.inc: the sub-word tokenizers (hf_tokenizer.h) classify every character as it does,
// including where it differs from the current Unicode (BERT's cleaning removes what Unicode 9 left
// unassigned, such as most recent emoji). Canonical combining classes come from utf8proc.
#ifndef QVI_SERVER_CORE_TEXT_HF_HF_UNICODE_H_
#define QVI_SERVER_CORE_TEXT_HF_HF_UNICODE_H_

#include <cstdint>
#include <string>

namespace qvi::hf {

// BertNormalizer's clean_text removes it: NUL, U+FFFD, and what the reference calls a control
// character (Cc, Cf, Cn, Co, Cs of its tables; not tab, newline or carriage return).
bool IsRemovedByCleaning(char32_t c);
// Rust's char::is_whitespace (the White_Space property).
bool IsWhitespace(char32_t c);
// BertPreTokenizer's punctuation: ASCII punctuation, or a P* character of the reference's tables.
bool IsBertPunctuation(char32_t c);
// BertNormalizer's accent stripping removes it (Mn of the reference's tables).
bool IsNonspacingMark(char32_t c);
// The StripAccents normalizer removes it (a combining mark: Mn, Mc or Me of the reference's tables).
bool IsCombiningMark(char32_t c);
// BertNormalizer's CJK ideographs, which it puts spaces around.
bool IsChineseChar(char32_t c);
// GPT-2's pattern's \p{L} and \p{N}, and what is neither nor \s, as its regex engine (Oniguruma) knows them.
bool IsRegexLetter(char32_t c);
bool IsRegexNumber(char32_t c);
bool IsRegexOther(char32_t c);
// The canonical decomposition of `c` (itself when it has none), appended to `out`.
void AppendNfd(char32_t c, std::u32string* out);
// Rust's char::to_lowercase of `c` (one or more code points), appended to `out`.
void AppendLowercase(char32_t c, std::u32string* out);
// The canonical combining class, for NFD's reordering of marks.
int CombiningClass(char32_t c);

}  // namespace qvi::hf

#endif  // QVI_SERVER_CORE_TEXT_HF_HF_UNICODE_H_

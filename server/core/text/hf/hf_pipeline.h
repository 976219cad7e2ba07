// Inside the sub-word tokenizers (hf_tokenizer.h): a text being normalized with its alignments to the
// original, and the normalizer and pre-tokenizer steps the reference's components are made of.
#ifndef QVI_SERVER_CORE_TEXT_HF_HF_PIPELINE_H_
#define QVI_SERVER_CORE_TEXT_HF_HF_PIPELINE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qvi::hf {

// Characters being normalized; character i came from the original characters [from[i], to[i]) (code
// point indices into the whole text), as the reference's NormalizedString aligns them: a character
// that replaces, or is made from, one original character is aligned to it.
struct Normalized {
  std::u32string chars;
  std::vector<uint32_t> from, to;
};

// The reference's normalizers, as steps: BertNormalizer is kClean, kChinese, kNfd + kStripNonspacing
// (when it strips accents) and kLowercase, as its options say; the StripAccents normalizer is
// kStripCombining (every combining mark, where BERT's strips only nonspacing ones).
enum class NormalizeStep { kClean, kChinese, kNfd, kStripNonspacing, kStripCombining, kLowercase };
void Apply(NormalizeStep step, Normalized* text);

// Word boundaries: each pre-tokenizer step splits every piece further. kWhitespace removes whitespace
// (WhitespaceSplit, and BertPreTokenizer's first split); kBertPunctuation isolates each punctuation
// character (its second).
enum class PreTokenizeStep { kWhitespace, kBertPunctuation };
using Pieces = std::vector<std::pair<size_t, size_t>>;  // [begin, end) in Normalized::chars
Pieces Split(PreTokenizeStep step, const std::u32string& chars, const Pieces& pieces);

// ByteLevel's pattern (GPT-2's: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+),
// its matches as pieces of chars [begin, end).
Pieces SplitGpt2(const std::u32string& chars, size_t begin, size_t end);
// The printable stand-in of a byte in byte-level vocabularies ('Ġ' for the space).
char32_t ByteChar(unsigned char b);
// Chars [begin, end) of `text` as their UTF-8 bytes' stand-ins, each aligned as the char it encodes.
Normalized ToByteChars(const Normalized& text, size_t begin, size_t end);

// UTF-8 of code points; the code points of UTF-8 that ValidateUtf8 (tokenizer.h) accepted.
void AppendUtf8(char32_t c, std::string* out);
std::string Utf8(const std::u32string& chars, size_t begin, size_t end);  // of chars [begin, end)
std::u32string Decode(std::string_view utf8);

}  // namespace qvi::hf

#endif  // QVI_SERVER_CORE_TEXT_HF_HF_PIPELINE_H_

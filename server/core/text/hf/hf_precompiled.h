// Inside the sub-word tokenizers (hf_tokenizer.h): the normalizers of a SentencePiece tokenizer converted to a
// tokenizer.json (XLM-R, T5, mBART...): Precompiled (SentencePiece's own normalization rules, compiled into a
// double-array trie), Strip and Replace -- each aligning the characters it writes to the original ones exactly as
// the reference's NormalizedString does, quirks included, so that offsets match to the character.
#ifndef QVI_SERVER_CORE_TEXT_HF_HF_PRECOMPILED_H_
#define QVI_SERVER_CORE_TEXT_HF_HF_PRECOMPILED_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/text/hf/hf_pipeline.h"

namespace qvi::hf {

// The reference's NormalizedString::transform: `dest` is the new text, each character with its change --
// 0: it replaces the next original character; 1: it is inserted, aligned as the character before it (the
// text's first: to nothing, [0, 0)); -n: it replaces the next character and n more are removed. The first
// `initial` characters are removed before. Characters nothing consumed are dropped.
using Change = std::pair<char32_t, int64_t>;
void Transform(const std::vector<Change>& dest, size_t initial, Normalized* text);

// The Precompiled normalizer's `precompiled_charsmap`: a little-endian u32 byte size, that many bytes of
// Darts double-array units (a trie of UTF-8 keys), then the replacements, each ended by NUL.
class Charsmap {
 public:
  // Every reachable node and replacement is checked here, so that lookups never leave the arrays.
  static absl::StatusOr<std::shared_ptr<const Charsmap>> Parse(std::string_view bytes, const std::string& path);
  // The reference's rule: per extended grapheme cluster, the cluster (under 6 bytes) replaced when a key
  // is a prefix of it, else each character replaced by its own key's replacement.
  void Apply(Normalized* text) const;
  int64_t MemoryBytes() const { return static_cast<int64_t>(units_.size() * 4 + replacements_.size()); }

 private:
  // The replacement of the shortest key that is a prefix of `chunk` (the reference takes the first
  // match of a common-prefix search), or nullopt.
  std::optional<std::string_view> Lookup(std::string_view chunk) const;
  absl::Status Check(const std::string& path) const;

  std::vector<uint32_t> units_;
  std::string replacements_;
};

// The Strip normalizer: whitespace removed from the left and/or right end.
void Strip(bool left, bool right, Normalized* text);

// The Replace normalizer: each match of the pattern, leftmost first and not overlapping, replaced by
// `content`, whose characters are aligned to the match's last one. The pattern is a String (`literal`)
// or a Regex of one repeated character (`c{n,}`, `c+`: `literal` is c, `min_repeats` n, matched greedily).
struct ReplaceRule {
  std::u32string literal;
  size_t min_repeats = 0;  // 0: the literal itself
  std::u32string content;
};
// The rule a Replace normalizer's pattern names, or why it is not implemented.
absl::StatusOr<ReplaceRule> ParseReplace(const std::string& string_pattern, const std::string& regex_pattern,
                                         const std::string& content, const std::string& path);
void Replace(const ReplaceRule& rule, Normalized* text);

}  // namespace qvi::hf

#endif  // QVI_SERVER_CORE_TEXT_HF_HF_PRECOMPILED_H_

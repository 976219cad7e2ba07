// The server's tokenizer: the same tokens, ids and offsets as the reference tokenizer in
// model_store/qvi/tokenizer.py (whose docstring states the rules). The shared vectors in
// tests/data/tokenizer_vectors.json pin both.
//
// Guarantees: input that is not valid UTF-8 is rejected with INVALID_ARGUMENT naming the byte
// offset; every token's `text` is exactly the input's bytes [byte_start, byte_end), and `start`/`end`
// count Unicode code points. Unicode data comes from utf8proc; characters assigned after the
// Python reference's Unicode version may be classified differently.
#ifndef QVI_SERVER_CORE_TEXT_TOKENIZER_H_
#define QVI_SERVER_CORE_TEXT_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace qvi {

struct TextToken {
  std::string text;    // the original bytes
  uint32_t start = 0;  // code points, inclusive
  uint32_t end = 0;    // code points, exclusive
  uint32_t byte_start = 0;
  uint32_t byte_end = 0;
  std::string normalized;  // what is looked up in the vocabulary
};

// kSubword: a Hugging Face tokenizer.json's sub-words (server/core/text/hf/), which the answer groups
// into the words its pre-tokenizer made (manifest format 2).
enum class TokenLevel { kWord, kChar, kSubword };

struct TokenizerOptions {
  TokenLevel level = TokenLevel::kWord;
  bool lowercase = true;
  int max_tokens = 128;
  bool casing = false;  // rule 7: each id folds in the token's case class (TokenId in vocabulary.h)
};

// Rule 7's case class of a token's original UTF-8 text (which the tokenizer has validated): from its
// cased letters, upper (Lu, Lt) and lower (Ll): 0 none, 1 lower, 2 title (one upper letter, the first
// cased one), 3 upper (two or more upper, no lower), 4 mixed.
inline constexpr int kCaseClasses = 5;
int CaseClass(std::string_view text);

class Tokenizer {
 public:
  explicit Tokenizer(TokenizerOptions options) : options_(options) {}

  // All tokens of `text` (no truncation: callers decide what to do with max_tokens).
  absl::StatusOr<std::vector<TextToken>> Tokenize(std::string_view text) const;

  const TokenizerOptions& options() const { return options_; }

 private:
  TokenizerOptions options_;
};

// Checks that `text` is well-formed UTF-8 (no overlong forms, surrogates or values past U+10FFFF).
// The error names the first bad byte's offset.
absl::Status ValidateUtf8(std::string_view text);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_TEXT_TOKENIZER_H_

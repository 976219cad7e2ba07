#include "server/frontend/tei/tokens.h"

#include "absl/strings/str_cat.h"
#include "server/core/text/vocabulary.h"

namespace qvi {

absl::StatusOr<std::vector<TeiToken>> TeiTokens(const Model& model, std::string_view text, bool add_special_tokens) {
  std::vector<TeiToken> out;
  if (const hf::HfTokenizer* subwords = model.subword_tokenizer(); subwords != nullptr) {
    absl::StatusOr<std::vector<hf::SubwordToken>> tokens = subwords->Encode(text, add_special_tokens);
    if (!tokens.ok()) return tokens.status();
    out.reserve(tokens->size());
    for (const hf::SubwordToken& t : *tokens) {
      // Special as the reference's special_tokens_mask, which TEI answers: the post-processor's tokens (they
      // belong to no word); an added token typed in the text is the text's.
      const bool special = t.special && t.word < 0;
      out.push_back(TeiToken{t.id,
                             special ? t.token : std::string(text.substr(t.byte_start, t.byte_end - t.byte_start)),
                             special, t.byte_start, t.byte_end});
    }
    return out;
  }
  absl::StatusOr<std::vector<TextToken>> words = model.tokenizer().Tokenize(text);
  if (!words.ok()) return words.status();
  out.reserve(words->size());
  for (const TextToken& t : *words) {
    out.push_back(
        TeiToken{TokenId(model.vocabulary(), model.tokenizer().options(), t), t.text, false, t.byte_start, t.byte_end});
  }
  return out;
}

absl::StatusOr<std::string> TeiDecodeIds(const Model& model, const std::vector<int64_t>& ids,
                                         bool skip_special_tokens) {
  const hf::HfTokenizer* subwords = model.subword_tokenizer();
  if (subwords == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", model.manifest().name, "' reads words, not sub-words: decoding needs a tokenizer.json's decoder"));
  }
  return subwords->DecodeIds(ids, skip_special_tokens);
}

}  // namespace qvi

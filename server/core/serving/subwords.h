// Sub-word models (Manifest::subwords(): a Hugging Face tokenizer.json's WordPiece, BPE or Unigram):
// a text is read as sub-words, answered per word.
//
// The words are the pieces the tokenizer's pre-tokenizer makes (with an added token of the text, such
// as a literal "[MASK]", a word of its own), each with the code-point and byte offsets of its sub-words
// in the caller's text. What the model computes per position is grouped into words by these rules
// (docs/serving.md, "Answers per word"):
//   α (attention), its sentence-level kin, and contributions   the sum over the word's sub-words
//                                                             (they add up: a text's words keep its total)
//   β, λ_Q, λ_K (gates, per token and per layer)               the mean over the word's sub-words
//   tags and emissions                                         the word's first sub-word's (the labelling
//                                                             the encoders are trained with)
//   attention maps [from, to]                                  from a word: the mean of its sub-words'
//                                                             rows; to a word: the sum of its columns
//                                                             (a row still sums to what the words receive)
//   occlusion                                                  the whole word deleted (all its sub-words)
// The special tokens ([CLS], [SEP], <s>, </s>) belong to no word: the word view leaves them out (what
// they carry is in the margins' rest, or in a map row's shortfall from 1); the sub-word view
// (options.subwords) shows them. Entities start and end on words in both views.
#ifndef QVI_SERVER_CORE_SERVING_SUBWORDS_H_
#define QVI_SERVER_CORE_SERVING_SUBWORDS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "server/core/model/model.h"
#include "server/core/outputs/answer.h"

namespace qvi {

// Reads `text` as `model`'s sub-words: result.tokens are the positions the model reads (special
// tokens included, each TokenOutput::word naming its word), result.words the words, `ids` the ids.
// A text over the model's max_tokens (which counts the special tokens) keeps the sub-words that fit
// (a word cut keeps the sub-words that fit) and is marked truncated; with `error_on_truncation` it is
// refused instead. result.num_tokens counts the positions the whole text needs.
absl::Status TokenizeSubwords(const Model& model, std::string_view text, bool error_on_truncation, TextResult& result,
                              std::vector<int64_t>& ids);

// The words as the answer's tokens (TokenOutput::word -1, ids of their first sub-words).
std::vector<TokenOutput> WordTokens(const std::vector<WordPieces>& words, const std::vector<TokenOutput>& subwords);

// Batch row `row` of `outputs` over the words instead of the sub-words, by the rules above: a batch
// of one row (row 0), of the outputs in `keep` only (a batch carries what any of its requests asked
// for; folding a map costs two products over it). Throws std::invalid_argument on outputs that do not
// fit the words.
ModelOutputs FoldToWords(const ModelOutputs& outputs, int64_t row, const std::vector<WordPieces>& words,
                         const OutputSet& keep);

// options.occlusion of a sub-word model: `ids` without each word's sub-words in turn (none for a text
// of fewer than two words), and how many ids those variants hold in all.
std::vector<std::vector<int64_t>> WordOcclusionVariantIds(const std::vector<int64_t>& ids,
                                                          const std::vector<WordPieces>& words);
int64_t WordOcclusionVariantTokens(int64_t ids, const std::vector<WordPieces>& words);

// Spans over words (token_start/end index words) as spans over the sub-word view's positions.
void SpansOnSubwords(const std::vector<WordPieces>& words, std::vector<SpanOutput>& spans);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_SUBWORDS_H_

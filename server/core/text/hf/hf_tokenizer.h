// Sub-word tokenizers read from a Hugging Face `tokenizer.json`, in C++: the ids and offsets Hugging
// Face's `tokenizers` (the version pinned in requirements-test.txt) gives for the same file and text,
// exactly -- tests/python/test_hf_tokenizer.py compares them on the shared vectors, the demo corpora
// and a hostile set. No Rust or Python at serve time.
//
// The pipeline is the reference's: added tokens (the special ones, matched on the raw text) split the
// text; each other piece is normalized (every normalized character remembers the original characters it
// came from), pre-tokenized into words, and each word split into sub-words by the model; the
// post-processor adds the special tokens around the sequence. Implemented so far:
//   normalizer      BertNormalizer, Lowercase, NFD, StripAccents, Sequence of these, or none
//   pre_tokenizer   BertPreTokenizer, WhitespaceSplit, Sequence of these; ByteLevel or Metaspace alone
//   model           WordPiece, BPE (no dropout, no byte fallback), Unigram (no byte fallback)
//   post_processor  BertProcessing, RobertaProcessing, ByteLevel, TemplateProcessing (single), or none
//   added_tokens    matched on the raw text, with lstrip and rstrip (no single_word)
// A file that names anything else fails to load with a message naming it (the JSON path and the type),
// never a silently different tokenization. The file's `truncation` and `padding` are not applied: the
// server truncates at the model's max_tokens and says so.
#ifndef QVI_SERVER_CORE_TEXT_HF_HF_TOKENIZER_H_
#define QVI_SERVER_CORE_TEXT_HF_HF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace qvi::hf {

struct SubwordToken {
  int64_t id = 0;
  std::string token;  // as the vocabulary spells it ("##ing")
  // Where it comes from in the text: code points [start, end) and bytes [byte_start, byte_end). A
  // special token the post-processor added covers nothing: all four are 0, as the reference says.
  uint32_t start = 0, end = 0;
  uint32_t byte_start = 0, byte_end = 0;
  int32_t word = -1;     // the pre-tokenizer's piece it belongs to, counted over the text; -1 for added tokens
  bool special = false;  // an added or post-processor token
};

class HfTokenizer {
 public:
  // Parses and checks a tokenizer.json. INVALID_ARGUMENT names the JSON path and what is wrong or
  // not implemented ("model.type 'BPE' is not implemented here; WordPiece is").
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(std::string_view json);
  virtual ~HfTokenizer() = default;

  // The tokens of `text` (valid UTF-8, else INVALID_ARGUMENT naming the byte), with the
  // post-processor's special tokens when `add_special_tokens`. No truncation.
  virtual absl::StatusOr<std::vector<SubwordToken>> Encode(std::string_view text,
                                                           bool add_special_tokens = true) const = 0;
  // The post-processor's special tokens around `sequence` (Encode's without them, truncated as the
  // caller needs: a model's max_tokens counts them).
  virtual std::vector<SubwordToken> AddSpecialTokens(std::vector<SubwordToken> sequence) const = 0;
  // The text of `ids`, as the reference's decode(ids, skip_special_tokens): each id's token (an added
  // token's, else the model's; the special ones left out when `skip_special_tokens`) through the file's
  // decoder. INVALID_ARGUMENT names an id that is no token's by its position ("[3]: 99999 is no token's id
  // ...", for the caller to prefix with its field; the reference would skip it); UNIMPLEMENTED when
  // the file's decoder is not one implemented here (WordPiece, Metaspace, ByteLevel, BPEDecoder, none),
  // which leaves encoding as it was.
  virtual absl::StatusOr<std::string> DecodeIds(const std::vector<int64_t>& ids, bool skip_special_tokens) const = 0;
  // How many special tokens the post-processor adds to one sequence (BERT: 2).
  virtual int SpecialTokensAdded() const = 0;
  // The vocabulary's size (ids are below it) and a rough count of the bytes the tokenizer holds.
  virtual int64_t VocabularySize() const = 0;
  virtual int64_t MemoryBytes() const = 0;
  // "WordPiece", "byte-level BPE", for cards and messages.
  virtual std::string Kind() const = 0;
};

}  // namespace qvi::hf

#endif  // QVI_SERVER_CORE_TEXT_HF_HF_TOKENIZER_H_

// Inside the sub-word tokenizers (hf_tokenizer.h): the tokenizer a tokenizer.json describes, read by
// hf_tokenizer.cc and run by hf_encode.cc: added tokens, normalizer, pre-tokenizer, model, post-processor.
#ifndef QVI_SERVER_CORE_TEXT_HF_HF_PIPELINE_TOKENIZER_H_
#define QVI_SERVER_CORE_TEXT_HF_HF_PIPELINE_TOKENIZER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "server/core/text/hf/hf_models.h"
#include "server/core/text/hf/hf_pipeline.h"
#include "server/core/text/hf/hf_precompiled.h"
#include "server/core/text/hf/hf_tokenizer.h"

namespace qvi::hf {

struct AddedToken {
  std::u32string chars;
  std::string content;
  int64_t id = 0;
  bool special = false;
  bool lstrip = false, rstrip = false;  // the match takes in the whitespace before / after it
};

// One piece of the post-processor's single-sequence template: the sequence, or special tokens.
struct TemplatePiece {
  bool sequence = false;
  std::vector<int64_t> ids;
  std::vector<std::string> tokens;
};

class PipelineTokenizer final : public HfTokenizer {
 public:
  // The file's decoder (hf_decode.cc): how DecodeIds joins tokens into text.
  struct Decoder {
    enum class Kind { kNone, kWordPiece, kMetaspace, kByteLevel, kBpe } kind = Kind::kNone;
    std::string affix;            // WordPiece's prefix ("##"), BPEDecoder's suffix ("</w>")
    bool cleanup = true;          // WordPiece's: " ." -> "." and the like, token by token
    char32_t replacement = 0;     // Metaspace's (▁)
    bool strip_first = true;      // Metaspace's: the first token's ▁s are dropped (prepend_scheme not never)
    std::string not_implemented;  // why DecodeIds refuses ("" : it decodes)
  };

  absl::Status Load(const Json& root);
  absl::StatusOr<std::vector<SubwordToken>> Encode(std::string_view text, bool add_special_tokens) const override;
  std::vector<SubwordToken> AddSpecialTokens(std::vector<SubwordToken> sequence) const override;
  int SpecialTokensAdded() const override;
  absl::StatusOr<std::string> DecodeIds(const std::vector<int64_t>& ids, bool skip_special_tokens) const override;
  int64_t VocabularySize() const override { return vocabulary_size_; }
  int64_t MemoryBytes() const override {
    return model_->MemoryBytes() + normalizer_bytes_ + 64 * static_cast<int64_t>(added_.size());
  }
  std::string Kind() const override { return byte_level_ ? "byte-level " + model_->Kind() : model_->Kind(); }

 private:
  // GPT-2's pre-tokenizer: a space put before each piece of text that lacks one, the pattern's
  // pieces, each character as its UTF-8 bytes' printable stand-ins.
  struct ByteLevel {
    bool add_prefix_space = true;
    bool use_regex = true;
  };
  // SentencePiece's pre-tokenizer: spaces as `replacement` (▁), one put before the text as the scheme
  // says, and (split) a piece at each, the ▁ going with what follows it.
  struct Metaspace {
    char32_t replacement = U'\u2581';
    enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
    bool split = true;
  };
  // Never fails the load: a decoder not implemented here makes DecodeIds refuse, naming it.
  void LoadDecoder(const Json& j);
  absl::Status LoadNormalizer(const Json& j, const std::string& path, int depth);
  // SentencePiece's: Precompiled, Strip, Replace (hf_precompiled.h).
  absl::Status LoadSentencePieceNormalizer(const Json& j, const std::string& path, const std::string& type);
  absl::Status LoadMetaspace(const Json& j, const std::string& path);
  // The pieces of a normalized segment that begins at character `begin` of the text, as the
  // pre-tokenizer splits them (ByteLevel and Metaspace first change the segment).
  Pieces PreTokenize(Normalized* n, size_t begin) const;
  Pieces SplitMetaspace(Normalized* n, size_t begin) const;
  absl::Status LoadPreTokenizer(const Json& j, const std::string& path, int depth);
  absl::Status LoadAddedTokens(const Json& j);
  absl::Status LoadPostProcessor(const Json& j);
  absl::Status LoadPair(const Json& j, const char* side);  // BertProcessing's or RobertaProcessing's cls/sep
  absl::Status LoadTemplate(const Json& j);
  absl::StatusOr<TemplatePiece> SpecialPiece(const std::string& path, const std::string& token, const Json* ids) const;
  // The segments of `text` between the added tokens: [begin, end) and the added token's index, or -1.
  std::vector<std::tuple<size_t, size_t, int>> SplitAdded(const std::u32string& text) const;
  // The words of one segment of the text (no added token in it), tokenized, appended to `out`.
  void EncodeSegment(const std::u32string& chars, size_t begin, size_t end, int32_t* word,
                     std::vector<SubwordToken>* out) const;
  // ByteLevel's and RobertaProcessing's trim_offsets: a token's leading and trailing spaces leave its offsets.
  void TrimOffsets(std::vector<SubwordToken>* tokens) const;

  std::vector<std::function<void(Normalized*)>> normalize_;  // in order
  int64_t normalizer_bytes_ = 0;                             // Precompiled's tables
  std::vector<PreTokenizeStep> pre_tokenize_;
  std::optional<ByteLevel> byte_level_;
  std::optional<Metaspace> metaspace_;
  std::optional<bool> trim_offsets_;  // set: trim, with the post-processor's add_prefix_space
  std::unique_ptr<SubwordModel> model_;
  std::vector<AddedToken> added_;
  absl::flat_hash_map<int64_t, size_t> added_by_id_;  // DecodeIds': an added token's index by its id
  std::vector<TemplatePiece> template_;
  Decoder decoder_;
  int64_t vocabulary_size_ = 0;
};

}  // namespace qvi::hf

#endif  // QVI_SERVER_CORE_TEXT_HF_HF_PIPELINE_TOKENIZER_H_

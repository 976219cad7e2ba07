// Inside the sub-word tokenizers (hf_tokenizer.h): the WordPiece tokenizer, its loading from a
// tokenizer.json (hf_tokenizer.cc) and its encoding (hf_wordpiece.cc).
#ifndef QVI_SERVER_CORE_TEXT_HF_HF_WORDPIECE_H_
#define QVI_SERVER_CORE_TEXT_HF_HF_WORDPIECE_H_

#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "server/core/text/hf/hf_pipeline.h"
#include "server/core/text/hf/hf_tokenizer.h"

namespace qvi::hf {

using Json = nlohmann::json;

struct AddedToken {
  std::u32string chars;
  std::string content;
  int64_t id = 0;
  bool special = false;
};

// One piece of the post-processor's single-sequence template: the sequence, or special tokens.
struct TemplatePiece {
  bool sequence = false;
  std::vector<int64_t> ids;
  std::vector<std::string> tokens;
};

class WordPieceTokenizer final : public HfTokenizer {
 public:
  absl::Status Load(const Json& root);
  absl::StatusOr<std::vector<SubwordToken>> Encode(std::string_view text, bool add_special_tokens) const override;
  int SpecialTokensAdded() const override {
    int n = 0;
    for (const TemplatePiece& p : template_) n += static_cast<int>(p.ids.size());
    return n;
  }
  int64_t VocabularySize() const override { return vocabulary_size_; }
  int64_t MemoryBytes() const override { return memory_bytes_; }
  std::string Kind() const override { return "WordPiece"; }

 private:
  absl::Status LoadNormalizer(const Json& j, const std::string& path, int depth);
  absl::Status LoadPreTokenizer(const Json& j, const std::string& path, int depth);
  absl::Status LoadModel(const Json& j);
  absl::Status LoadVocabulary(const Json& vocab);  // model.vocab, after the prefix is known
  absl::Status LoadAddedTokens(const Json& j);
  absl::Status LoadPostProcessor(const Json& j);
  absl::Status LoadBertProcessing(const Json& j);  // [CLS] $A [SEP] from its cls and sep
  absl::StatusOr<TemplatePiece> SpecialPiece(const std::string& path, const std::string& token, const Json* ids) const;
  // The segments of `text` between the added tokens: [begin, end) and the added token's index, or -1.
  std::vector<std::tuple<size_t, size_t, int>> SplitAdded(const std::u32string& text) const;
  // WordPiece on chars [begin, end) of `n`, appended to `out`.
  void TokenizeWord(const Normalized& n, size_t begin, size_t end, int32_t word, std::vector<SubwordToken>* out) const;

  std::vector<NormalizeStep> normalize_;
  std::vector<PreTokenizeStep> pre_tokenize_;
  absl::flat_hash_map<std::string, int64_t> vocab_;       // every token
  absl::flat_hash_map<std::string, int64_t> continuing_;  // "##ing" by "ing"
  std::string prefix_ = "##";
  std::string unk_;
  int64_t unk_id_ = 0;
  size_t max_chars_ = 100;
  std::vector<AddedToken> added_;
  std::vector<TemplatePiece> template_;
  int64_t vocabulary_size_ = 0;
  int64_t memory_bytes_ = 0;
};

}  // namespace qvi::hf

#endif  // QVI_SERVER_CORE_TEXT_HF_HF_WORDPIECE_H_

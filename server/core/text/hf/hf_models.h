// Inside the sub-word tokenizers (hf_tokenizer.h): the models that split one word into sub-words --
// WordPiece (BERT's greedy longest match) and BPE (merges by rank) -- and the JSON reading they share
// with the rest of the pipeline.
#ifndef QVI_SERVER_CORE_TEXT_HF_HF_MODELS_H_
#define QVI_SERVER_CORE_TEXT_HF_HF_MODELS_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qvi::hf {

using Json = nlohmann::json;

inline constexpr size_t kMaxJsonBytes = size_t{256} << 20;
inline constexpr size_t kMaxVocabulary = 4'000'000;
inline constexpr size_t kMaxMerges = 4'000'000;
inline constexpr size_t kMaxTokenBytes = 1024;

// INVALID_ARGUMENT "tokenizer.json: PATH: WHAT".
absl::Status Bad(absl::string_view path, absl::string_view what);
// INVALID_ARGUMENT naming a component this implementation does not have.
absl::Status NotImplemented(absl::string_view path, absl::string_view type, absl::string_view implemented);
// The string at `key` of object `j`, or why not.
absl::StatusOr<std::string> String(const Json& j, absl::string_view path, const char* key);
// The boolean at `key`, or `otherwise` when absent or null.
bool Flag(const Json& j, const char* key, bool otherwise);

// Token -> id, and the id of `token` in it, or -1.
using Vocab = absl::flat_hash_map<std::string, int64_t>;
int64_t IdIn(const Vocab& vocab, absl::string_view token);

// A sub-word of a word: its id, its spelling in the vocabulary, and the word's characters [begin, end).
struct SubwordPiece {
  int64_t id = 0;
  std::string token;
  size_t begin = 0, end = 0;
};

class SubwordModel {
 public:
  virtual ~SubwordModel() = default;
  // The sub-words of `word` (one pre-token, its characters after normalization), appended to `out`.
  virtual void Tokenize(const std::u32string& word, std::vector<SubwordPiece>* out) const = 0;
  // The id of `token`, or -1 when the vocabulary lacks it.
  virtual int64_t Id(absl::string_view token) const = 0;
  // The token of `id` (0 <= id < VocabularySize()), as the vocabulary spells it.
  virtual const std::string& Token(int64_t id) const = 0;
  virtual int64_t VocabularySize() const = 0;
  virtual int64_t MemoryBytes() const = 0;
  virtual std::string Kind() const = 0;
};

// The file's "model": WordPiece, BPE (the byte-level family's and others') or Unigram (hf_unigram.cc).
absl::StatusOr<std::unique_ptr<SubwordModel>> LoadModel(const Json& model);
absl::StatusOr<std::unique_ptr<SubwordModel>> LoadUnigram(const Json& model);

}  // namespace qvi::hf

#endif  // QVI_SERVER_CORE_TEXT_HF_HF_MODELS_H_

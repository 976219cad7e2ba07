// Token string -> id, as stored in the artifact's vocab.txt (one token per line, id = line number).
#ifndef QVI_SERVER_CORE_TEXT_VOCABULARY_H_
#define QVI_SERVER_CORE_TEXT_VOCABULARY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/text/tokenizer.h"

namespace qvi {

class Vocabulary {
 public:
  static constexpr int64_t kPadId = 0;
  static constexpr int64_t kUnkId = 1;

  // Parses vocab.txt; it must start with [PAD] and [UNK] and repeat no token.
  static absl::StatusOr<Vocabulary> Parse(std::string_view text);

  int64_t Id(absl::string_view normalized) const {
    auto it = index_.find(normalized);
    return it == index_.end() ? kUnkId : it->second;
  }
  size_t size() const { return tokens_.size(); }

 private:
  std::vector<std::string> tokens_;
  // One look-up per token of every request: an open-addressing map takes ~16 ns a token here where
  // std::unordered_map took ~35 (qvi-bench-tokenizer's Lookup, docs/performance.md).
  absl::flat_hash_map<std::string, int64_t> index_;
};

// The id a model is fed for `token`: its vocabulary id, plus vocabulary size x its case class when the
// tokenizer folds casing in (rule 7), so that [PAD] stays 0 and one id still names one token.
inline int64_t TokenId(const Vocabulary& vocab, const TokenizerOptions& options, const TextToken& token) {
  const int64_t id = vocab.Id(token.normalized);
  return options.casing ? id + static_cast<int64_t>(vocab.size()) * CaseClass(token.text) : id;
}

}  // namespace qvi

#endif  // QVI_SERVER_CORE_TEXT_VOCABULARY_H_

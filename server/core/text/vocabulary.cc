#include "server/core/text/vocabulary.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qvi {

absl::StatusOr<Vocabulary> Vocabulary::Parse(std::string_view text) {
  Vocabulary v;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    v.tokens_.emplace_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (v.tokens_.size() < 2 || v.tokens_[0] != "[PAD]" || v.tokens_[1] != "[UNK]") {
    return absl::InvalidArgumentError("vocab.txt must start with the lines [PAD] and [UNK]");
  }
  v.index_.reserve(v.tokens_.size());
  for (size_t i = 0; i < v.tokens_.size(); ++i) {
    if (!v.index_.emplace(v.tokens_[i], static_cast<int64_t>(i)).second) {
      return absl::InvalidArgumentError(absl::StrCat("vocab.txt repeats the token on line ", i + 1));
    }
  }
  return v;
}

}  // namespace qvi

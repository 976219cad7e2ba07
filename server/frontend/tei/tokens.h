// TEI's /tokenize and /decode, protocol-neutral (the HTTP routes: server/http/tei/tokenize_routes.h; TEI's gRPC
// service: server/grpc/tei/tei_service.h): a text's tokens as TEI answers them, and ids back to text.
#ifndef QVI_SERVER_FRONTEND_TEI_TOKENS_H_
#define QVI_SERVER_FRONTEND_TEI_TOKENS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/model/model.h"

namespace qvi {

// One token as TEI's SimpleToken: a special token the tokenizer adds has its own spelling as `text` and no
// offsets (`special`: the reference's special_tokens_mask, so an added token typed in the text is the text's);
// the others the text's bytes [start, stop).
struct TeiToken {
  int64_t id = 0;
  std::string text;
  bool special = false;
  uint32_t start = 0, stop = 0;  // bytes; unset for a special token
};

// `text`'s tokens under `model`'s tokenizer: a sub-word model's tokenizer.json (its special tokens when
// `add_special_tokens`), else the model's words and their vocabulary ids. Nothing is truncated.
absl::StatusOr<std::vector<TeiToken>> TeiTokens(const Model& model, std::string_view text, bool add_special_tokens);

// `ids` as text (hf_tokenizer.h's DecodeIds): INVALID_ARGUMENT "[3]: 99999 is no token's id ..." for an id by its
// position; FAILED_PRECONDITION for a model that reads words (no tokenizer.json to decode with).
absl::StatusOr<std::string> TeiDecodeIds(const Model& model, const std::vector<int64_t>& ids, bool skip_special_tokens);

}  // namespace qvi

#endif  // QVI_SERVER_FRONTEND_TEI_TOKENS_H_

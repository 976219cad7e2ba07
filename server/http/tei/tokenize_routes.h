// TEI's /tokenize and /decode on the HTTP port (docs/serving.md, "Drop-in routes"), for the model a TEI route
// answers from (tei_routes.h: the path's, --default-model, the store's only one):
//   POST /tokenize, /models/{m}/tokenize  {"inputs": "text" | ["text", ...], "add_special_tokens": true}
//        -> a list per text (always a list of lists) of {"id", "text", "special", "start", "stop"}: start and
//           stop are byte offsets into the text and `text` its bytes there; a special token the tokenizer adds
//           has its own spelling as text, and null start and stop (as TEI writes them).
//   POST /decode, /models/{m}/decode  {"ids": [101, 7592, ...] | [[...], [...]], "skip_special_tokens": true}
//        -> a list of texts, one per list of ids (hf_tokenizer.h's DecodeIds: the tokenizer.json's decoder).
// A sub-word model answers with its tokenizer.json; a word-level model (the GloVe demo models) tokenizes into
// its words and their vocabulary ids, and has no /decode (refused: it would need its words' case back). No text
// is truncated (the model's max_tokens is the predict routes'). Both run through the call layer (API keys,
// per-key limits, metrics as "Tokenize" and "Decode"); the answer's bytes are held against the in-flight limit
// before it is written. Errors take TEI's form (TeiError).
#ifndef QVI_SERVER_HTTP_TEI_TOKENIZE_ROUTES_H_
#define QVI_SERVER_HTTP_TEI_TOKENIZE_ROUTES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request_checks.h"
#include "server/frontend/call.h"
#include "server/http/http_server.h"
#include "server/http/routes.h"

namespace qvi {

struct TeiTokenize {
  std::vector<std::string> texts;
  bool add_special_tokens = true;
};
// Errors name the field; a text over `max_text_bytes` is refused.
absl::StatusOr<TeiTokenize> ParseTeiTokenize(const std::string& body, int max_texts, int max_text_bytes);

struct TeiDecode {
  std::vector<std::vector<int64_t>> ids;
  bool skip_special_tokens = true;
};
// At most `max_texts` lists of ids, and 128 ids a list on average (ScanBody's bound on the values).
absl::StatusOr<TeiDecode> ParseTeiDecode(const std::string& body, int max_texts);

void ServeTeiTokens(Calls* calls, const ModelRepository& repository, const RequestLimits& limits,
                    const std::string& default_model, const HttpRoute& route, HttpRequest request,
                    HttpServer::Reply reply);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_TEI_TOKENIZE_ROUTES_H_

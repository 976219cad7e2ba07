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
#include "server/frontend/core.h"
#include "server/http/drop_in_bodies.h"
#include "server/http/http_server.h"
#include "server/http/routes.h"

namespace qvi {

// Answers on a request thread (core->TryRun): the work grows with the texts, and the I/O thread serves every
// connection.
void ServeTeiTokens(Core* core, Calls* calls, const ModelRepository& repository, const std::string& default_model,
                    const HttpRoute& route, HttpRequest request, HttpServer::Reply reply);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_TEI_TOKENIZE_ROUTES_H_

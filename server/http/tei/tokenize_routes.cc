#include "server/http/tei/tokenize_routes.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/core/base/exception_text.h"
#include "server/core/text/vocabulary.h"
#include "server/http/drop_in.h"
#include "server/http/http_call.h"
#include "server/http/tei/tei_routes.h"

namespace qvi {
namespace {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

ordered Token(int64_t id, const std::string& text, bool special, uint32_t start, uint32_t stop) {
  return ordered{{"id", id},
                 {"text", text},
                 {"special", special},
                 {"start", special ? ordered(nullptr) : ordered(start)},
                 {"stop", special ? ordered(nullptr) : ordered(stop)}};
}

// One text's tokens as TEI writes them: a sub-word model's tokenizer.json's, or a word-level model's words.
absl::StatusOr<ordered> Tokens(const Model& model, const std::string& text, bool add_special_tokens) {
  ordered out = ordered::array();
  if (const hf::HfTokenizer* subwords = model.subword_tokenizer(); subwords != nullptr) {
    absl::StatusOr<std::vector<hf::SubwordToken>> tokens = subwords->Encode(text, add_special_tokens);
    if (!tokens.ok()) return tokens.status();
    for (const hf::SubwordToken& t : *tokens) {
      // Special as the reference's special_tokens_mask is, which TEI answers: the post-processor's tokens
      // (they belong to no word); an added token typed in the text is the text's.
      const bool special = t.special && t.word < 0;
      out.push_back(Token(t.id, special ? t.token : text.substr(t.byte_start, t.byte_end - t.byte_start), special,
                          t.byte_start, t.byte_end));
    }
    return out;
  }
  absl::StatusOr<std::vector<TextToken>> words = model.tokenizer().Tokenize(text);
  if (!words.ok()) return words.status();
  for (const TextToken& t : *words) {
    out.push_back(
        Token(TokenId(model.vocabulary(), model.tokenizer().options(), t), t.text, false, t.byte_start, t.byte_end));
  }
  return out;
}

std::string Dump(const ordered& j) { return j.dump(-1, ' ', false, ordered::error_handler_t::replace); }

// A JSON list of `n` items, each written by `item(i)`, refused once it passes `max_bytes` (0: no limit): a
// list is never held whole past the limit.
template <typename Item>
absl::StatusOr<std::string> List(size_t n, int64_t max_bytes, Item&& item) {
  std::string out = "[";
  for (size_t i = 0; i < n; ++i) {
    absl::StatusOr<std::string> one = item(i);
    if (!one.ok()) return one.status();
    if (max_bytes > 0 && static_cast<int64_t>(out.size() + one->size()) + 2 > max_bytes) {  // a comma, the ]
      return Invalid(absl::StrCat("the answer would pass ", max_bytes,
                                  " bytes (--max-message-bytes); send fewer or shorter texts"));
    }
    absl::StrAppend(&out, i ? "," : "", *one);
  }
  return out + "]";
}

// The answer to a parsed /tokenize or /decode body (`tokenize`'s texts, or `decode`'s ids) from `model`.
absl::StatusOr<std::string> Answer(const Model& model, const TeiTokenize* tokenize, const TeiDecode* decode,
                                   int64_t max_bytes) {
  if (tokenize != nullptr) {
    return List(tokenize->texts.size(), max_bytes, [&](size_t i) -> absl::StatusOr<std::string> {
      absl::StatusOr<ordered> tokens = Tokens(model, tokenize->texts[i], tokenize->add_special_tokens);
      if (!tokens.ok()) {
        return absl::Status(tokens.status().code(), absl::StrCat("inputs[", i, "]: ", tokens.status().message()));
      }
      return Dump(*tokens);
    });
  }
  const hf::HfTokenizer* subwords = model.subword_tokenizer();
  if (subwords == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", model.manifest().name, "' reads words, not sub-words: /decode needs a tokenizer.json's decoder"));
  }
  return List(decode->ids.size(), max_bytes, [&](size_t i) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> text = subwords->DecodeIds(decode->ids[i], decode->skip_special_tokens);
    if (!text.ok()) {
      // "[3]: ..." from DecodeIds (an id by its position) names the field here: ids[3], or ids[1][3] in a batch.
      const std::string field = decode->batch ? absl::StrCat("ids[", i, "]") : "ids";
      const bool positioned = absl::StartsWith(text.status().message(), "[");
      return absl::Status(text.status().code(), absl::StrCat(field, positioned ? "" : ": ", text.status().message()));
    }
    return Dump(ordered(*std::move(text)));
  });
}

// A /tokenize or /decode call past its checks, answered on a request thread.
struct TokenJob {
  std::shared_ptr<HttpCall> call;
  InferenceRequest counted;
  std::optional<TeiTokenize> tokenize;
  std::optional<TeiDecode> decode;
  ServableHandle servable;
  int64_t max_bytes = 0;

  void Run(absl::Time now) {
    if (now > counted.deadline) return call->Fail(absl::DeadlineExceededError("the call's deadline passed"));
    absl::StatusOr<std::string> body;
    try {
      body = Answer(*servable->model, tokenize ? &*tokenize : nullptr, decode ? &*decode : nullptr, max_bytes);
    } catch (...) {  // its bytes held in flight are given back by the call's one answer
      body = absl::InternalError(absl::StrCat("answering failed: ", CurrentExceptionText()));
    }
    if (!body.ok()) return call->Fail(body.status());
    if (absl::Status held = counted.hold_answer_bytes(static_cast<int64_t>(body->size())); !held.ok()) {
      return call->Fail(held);
    }
    call->Answer(HttpResponse{200, "application/json", *std::move(body), {}});
  }
};

}  // namespace

void ServeTeiTokens(Core* core, Calls* calls, const ModelRepository& repository, const std::string& default_model,
                    const HttpRoute& route, HttpRequest request, HttpServer::Reply reply) {
  const RequestLimits& limits = core->limits();
  const bool tokenize = route.kind == HttpRoute::Kind::kTeiTokenize;
  auto call = std::make_shared<HttpCall>(calls, tokenize ? "Tokenize" : "Decode", request, std::move(reply));
  call->set_error_form(TeiError);
  absl::StatusOr<std::string> model = TeiModel(route, default_model, repository, tokenize ? "tokenize" : "decode");
  if (model.ok()) call->call().model = *model;
  if (absl::Status admitted = call->call().Admission(request.Header("Authorization")); !admitted.ok()) {
    return call->Fail(admitted);
  }
  if (!model.ok()) return call->Fail(model.status());
  auto job = std::make_shared<TokenJob>();
  job->call = call;
  job->counted.model = *model;  // what the call layer counts and limits: the model, the texts (or lists of ids)
  if (tokenize) {
    absl::StatusOr<TeiTokenize> texts = ParseTeiTokenize(request.body, limits.max_texts, limits.max_text_bytes);
    if (!texts.ok()) return call->Fail(texts.status());
    job->tokenize = *std::move(texts);
    job->counted.texts.resize(job->tokenize->texts.size());
  } else {
    absl::StatusOr<TeiDecode> ids = ParseTeiDecode(request.body, limits.max_texts);
    if (!ids.ok()) return call->Fail(ids.status());
    job->decode = *std::move(ids);
    job->counted.texts.resize(job->decode->ids.size());
  }
  if (absl::Status s = call->Prepare(job->counted, request, limits.max_request_id_bytes); !s.ok()) {
    return call->Fail(s);
  }
  absl::StatusOr<ServableHandle> servable = repository.Resolve(*model, route.version);
  if (!servable.ok()) return call->Fail(servable.status());
  job->servable = *std::move(servable);
  job->max_bytes = limits.max_response_bytes;
  // Up to --max-texts-per-request texts of --max-text-bytes each: a request thread's work, not the I/O thread's.
  if (!core->TryRun([job, env = &core->env()] { job->Run(env->Now()); })) {
    call->Fail(absl::ResourceExhaustedError("the server's request queue is full; retry with backoff"));
  }
}

}  // namespace qvi

#include "server/http/tei/tokenize_routes.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/core/base/exception_text.h"
#include "server/frontend/tei/tokens.h"
#include "server/http/drop_in.h"
#include "server/http/http_call.h"
#include "server/http/tei/tei_routes.h"

namespace qvi {
namespace {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

ordered Token(const TeiToken& t) {
  return ordered{{"id", t.id},
                 {"text", t.text},
                 {"special", t.special},
                 {"start", t.special ? ordered(nullptr) : ordered(t.start)},
                 {"stop", t.special ? ordered(nullptr) : ordered(t.stop)}};
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
      absl::StatusOr<std::vector<TeiToken>> tokens = TeiTokens(model, tokenize->texts[i], tokenize->add_special_tokens);
      if (!tokens.ok()) {
        return absl::Status(tokens.status().code(), absl::StrCat("inputs[", i, "]: ", tokens.status().message()));
      }
      ordered out = ordered::array();
      for (const TeiToken& t : *tokens) out.push_back(Token(t));
      return Dump(out);
    });
  }
  return List(decode->ids.size(), max_bytes, [&](size_t i) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> text = TeiDecodeIds(model, decode->ids[i], decode->skip_special_tokens);
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

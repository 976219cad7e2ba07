#include "server/http/tei/tokenize_routes.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/core/text/vocabulary.h"
#include "server/http/drop_in.h"
#include "server/http/http_call.h"
#include "server/http/native/json_body.h"
#include "server/http/tei/tei_routes.h"

namespace qvi {
namespace {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// TEI's "Empty" message (TeiError answers it 400).
constexpr char kEmpty[] = "Input validation error: `inputs` cannot be empty";
// The values a /decode body may hold: ScanBody's bound for this many "texts" (4 values each), 128 ids a list.
constexpr int kIdsPerText = 32;

absl::Status ReadText(const json& v, const std::string& field, int max_text_bytes, std::vector<std::string>& out) {
  if (!v.is_string()) return Invalid(absl::StrCat(field, ": not a text"));
  const std::string& text = v.get_ref<const std::string&>();
  if (text.empty()) return Invalid(kEmpty);
  if (static_cast<int64_t>(text.size()) > max_text_bytes) {
    return Invalid(
        absl::StrCat(field, ": ", text.size(), " bytes, over the limit of ", max_text_bytes, " (--max-text-bytes)"));
  }
  out.push_back(text);
  return absl::OkStatus();
}

absl::Status ReadFlag(const json& j, const char* key, bool& out) {
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  if (!j[key].is_boolean()) return Invalid(absl::StrCat(key, ": not true or false"));
  out = j[key].get<bool>();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ReadIds(const json& list, const std::string& field) {
  if (list.empty()) return Invalid("Input validation error: `input_ids` cannot be empty");
  std::vector<int64_t> ids;
  ids.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_number_unsigned() || list[i].get<uint64_t>() > (uint64_t{1} << 32)) {
      return Invalid(absl::StrCat(field, "[", i, "]: not a token id (a whole number from 0)"));
    }
    ids.push_back(static_cast<int64_t>(list[i].get<uint64_t>()));
  }
  return ids;
}

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
    if (max_bytes > 0 && static_cast<int64_t>(out.size() + one->size()) + 1 > max_bytes) {
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
      const std::string where = decode->ids.size() > 1 ? absl::StrCat("ids[", i, "]: ") : "";
      return absl::Status(text.status().code(), absl::StrCat(where, text.status().message()));
    }
    return Dump(ordered(*std::move(text)));
  });
}

}  // namespace

absl::StatusOr<TeiTokenize> ParseTeiTokenize(const std::string& body, int max_texts, int max_text_bytes) {
  if (absl::Status scanned = ScanBody(body, max_texts); !scanned.ok()) return scanned;  // json_body.h
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("the body is not a JSON object");
  if (!j.contains("inputs")) return Invalid("inputs: missing");
  TeiTokenize out;
  const json& inputs = j["inputs"];
  if (inputs.is_array()) {
    if (inputs.empty()) return Invalid(kEmpty);
    if (static_cast<int64_t>(inputs.size()) > max_texts) {
      return Invalid(absl::StrCat("batch size ", inputs.size(), " > maximum allowed batch size ", max_texts,
                                  " (--max-texts-per-request)"));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (absl::Status s = ReadText(inputs[i], absl::StrCat("inputs[", i, "]"), max_text_bytes, out.texts); !s.ok()) {
        return s;
      }
    }
  } else if (absl::Status s = ReadText(inputs, "inputs", max_text_bytes, out.texts); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadFlag(j, "add_special_tokens", out.add_special_tokens); !s.ok()) return s;
  if (j.contains("prompt_name") && !j["prompt_name"].is_null()) {
    return Invalid("prompt_name: these models have no prompts (an embedding model's, in TEI)");
  }
  return out;
}

absl::StatusOr<TeiDecode> ParseTeiDecode(const std::string& body, int max_texts) {
  if (absl::Status scanned = ScanBody(body, max_texts * kIdsPerText); !scanned.ok()) return scanned;
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("the body is not a JSON object");
  if (!j.contains("ids")) return Invalid("ids: missing");
  const json& ids = j["ids"];
  if (!ids.is_array()) return Invalid("ids: a list of token ids, or a list of such lists");
  TeiDecode out;
  if (!ids.empty() && ids[0].is_array()) {
    if (static_cast<int64_t>(ids.size()) > max_texts) {
      return Invalid(absl::StrCat("batch size ", ids.size(), " > maximum allowed batch size ", max_texts,
                                  " (--max-texts-per-request)"));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string field = absl::StrCat("ids[", i, "]");
      if (!ids[i].is_array()) return Invalid(absl::StrCat(field, ": not a list of token ids"));
      absl::StatusOr<std::vector<int64_t>> list = ReadIds(ids[i], field);
      if (!list.ok()) return list.status();
      out.ids.push_back(*std::move(list));
    }
  } else {
    absl::StatusOr<std::vector<int64_t>> list = ReadIds(ids, "ids");
    if (!list.ok()) return list.status();
    out.ids.push_back(*std::move(list));
  }
  if (absl::Status s = ReadFlag(j, "skip_special_tokens", out.skip_special_tokens); !s.ok()) return s;
  return out;
}

void ServeTeiTokens(Calls* calls, const ModelRepository& repository, const RequestLimits& limits,
                    const std::string& default_model, const HttpRoute& route, HttpRequest request,
                    HttpServer::Reply reply) {
  const bool tokenize = route.kind == HttpRoute::Kind::kTeiTokenize;
  auto call = std::make_shared<HttpCall>(calls, tokenize ? "Tokenize" : "Decode", request, std::move(reply));
  call->set_error_form(TeiError);
  absl::StatusOr<std::string> model = TeiModel(route, default_model, repository);
  if (model.ok()) call->call().model = *model;
  if (absl::Status admitted = call->call().Admission(request.Header("Authorization")); !admitted.ok()) {
    return call->Fail(admitted);
  }
  if (!model.ok()) return call->Fail(model.status());
  absl::StatusOr<TeiTokenize> texts;
  absl::StatusOr<TeiDecode> ids;
  InferenceRequest counted;  // what the call layer counts and limits: the model, the texts (or lists of ids)
  counted.model = *model;
  if (tokenize) {
    texts = ParseTeiTokenize(request.body, limits.max_texts, limits.max_text_bytes);
    if (!texts.ok()) return call->Fail(texts.status());
    counted.texts.resize(texts->texts.size());
  } else {
    ids = ParseTeiDecode(request.body, limits.max_texts);
    if (!ids.ok()) return call->Fail(ids.status());
    counted.texts.resize(ids->ids.size());
  }
  if (absl::Status s = call->Prepare(counted, request, limits.max_request_id_bytes); !s.ok()) return call->Fail(s);
  absl::StatusOr<ServableHandle> servable = repository.Resolve(*model, route.version);
  if (!servable.ok()) return call->Fail(servable.status());
  absl::StatusOr<std::string> body =
      Answer(*(*servable)->model, tokenize ? &*texts : nullptr, tokenize ? nullptr : &*ids, limits.max_response_bytes);
  if (!body.ok()) return call->Fail(body.status());
  if (absl::Status held = counted.hold_answer_bytes(static_cast<int64_t>(body->size())); !held.ok()) {
    return call->Fail(held);
  }
  call->Answer(HttpResponse{200, "application/json", *std::move(body), {}});
}

}  // namespace qvi

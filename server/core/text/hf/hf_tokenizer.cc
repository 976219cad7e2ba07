// Reading a tokenizer.json and encoding with it (hf_tokenizer.h).
#include "server/core/text/hf/hf_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/text/hf/hf_pipeline.h"
#include "server/core/text/hf/hf_wordpiece.h"
#include "server/core/text/tokenizer.h"

namespace qvi::hf {
namespace {

constexpr size_t kMaxJsonBytes = size_t{256} << 20;
constexpr size_t kMaxVocabulary = 4'000'000;
constexpr size_t kMaxTokenBytes = 1024;
constexpr size_t kMaxAddedTokens = 10'000;
constexpr int kMaxNesting = 16;  // Sequence in Sequence

absl::Status Bad(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", path, ": ", what));
}

absl::Status NotImplemented(absl::string_view path, absl::string_view type, absl::string_view implemented) {
  return Bad(path, absl::StrCat("type '", type.substr(0, 64), "' is not implemented here (", implemented,
                                " are); the model cannot be served with this tokenizer"));
}

// The string at `key` of object `j`, or why not.
absl::StatusOr<std::string> String(const Json& j, absl::string_view path, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return Bad(absl::StrCat(path, ".", key), "must be a string");
  return it->get<std::string>();
}

bool Flag(const Json& j, const char* key, bool otherwise) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : otherwise;
}

}  // namespace

absl::Status WordPieceTokenizer::LoadNormalizer(const Json& j, const std::string& path, int depth) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_object() || depth > kMaxNesting) return Bad(path, "must be an object (or null)");
  absl::StatusOr<std::string> type = String(j, path, "type");
  if (!type.ok()) return type.status();
  if (*type == "BertNormalizer") {
    const bool lowercase = Flag(j, "lowercase", true);
    if (Flag(j, "clean_text", true)) normalize_.push_back(NormalizeStep::kClean);
    if (Flag(j, "handle_chinese_chars", true)) normalize_.push_back(NormalizeStep::kChinese);
    if (Flag(j, "strip_accents", lowercase)) {  // null: as lowercase says
      normalize_.push_back(NormalizeStep::kNfd);
      normalize_.push_back(NormalizeStep::kStripNonspacing);
    }
    if (lowercase) normalize_.push_back(NormalizeStep::kLowercase);
  } else if (*type == "Lowercase") {
    normalize_.push_back(NormalizeStep::kLowercase);
  } else if (*type == "NFD") {
    normalize_.push_back(NormalizeStep::kNfd);
  } else if (*type == "StripAccents") {
    normalize_.push_back(NormalizeStep::kStripCombining);
  } else if (*type == "Sequence") {
    auto steps = j.find("normalizers");
    if (steps == j.end() || !steps->is_array()) return Bad(path + ".normalizers", "must be an array");
    for (size_t i = 0; i < steps->size(); ++i) {
      if (absl::Status s = LoadNormalizer((*steps)[i], absl::StrCat(path, ".normalizers[", i, "]"), depth + 1); !s.ok())
        return s;
    }
  } else {
    return NotImplemented(path + ".type", *type, "BertNormalizer, Lowercase, NFD, StripAccents and Sequence");
  }
  return absl::OkStatus();
}

absl::Status WordPieceTokenizer::LoadPreTokenizer(const Json& j, const std::string& path, int depth) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_object() || depth > kMaxNesting) return Bad(path, "must be an object (or null)");
  absl::StatusOr<std::string> type = String(j, path, "type");
  if (!type.ok()) return type.status();
  if (*type == "BertPreTokenizer") {
    pre_tokenize_.push_back(PreTokenizeStep::kWhitespace);
    pre_tokenize_.push_back(PreTokenizeStep::kBertPunctuation);
  } else if (*type == "WhitespaceSplit") {
    pre_tokenize_.push_back(PreTokenizeStep::kWhitespace);
  } else if (*type == "Sequence") {
    auto steps = j.find("pretokenizers");
    if (steps == j.end() || !steps->is_array()) return Bad(path + ".pretokenizers", "must be an array");
    for (size_t i = 0; i < steps->size(); ++i) {
      if (absl::Status s = LoadPreTokenizer((*steps)[i], absl::StrCat(path, ".pretokenizers[", i, "]"), depth + 1);
          !s.ok())
        return s;
    }
  } else {
    return NotImplemented(path + ".type", *type, "BertPreTokenizer, WhitespaceSplit and Sequence");
  }
  return absl::OkStatus();
}

absl::Status WordPieceTokenizer::LoadVocabulary(const Json& vocab) {
  if (vocab.size() > kMaxVocabulary) {
    return Bad("model.vocab", absl::StrCat(vocab.size(), " tokens, over the limit of ", kMaxVocabulary));
  }
  vocabulary_size_ = static_cast<int64_t>(vocab.size());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocabulary_size_) {
      return Bad("model.vocab", absl::StrCat("the id of '", token.substr(0, 64), "' is not in [0, ", vocabulary_size_,
                                             "), the vocabulary's size"));
    }
    const int64_t v = id.get<int64_t>();
    if (seen[static_cast<size_t>(v)]) return Bad("model.vocab", absl::StrCat("id ", v, " is given to two tokens"));
    seen[static_cast<size_t>(v)] = true;
    if (token.empty() || token.size() > kMaxTokenBytes) {
      return Bad("model.vocab", absl::StrCat("a token of ", token.size(), " bytes (1 to ", kMaxTokenBytes, ")"));
    }
    vocab_.emplace(token, v);
    if (!prefix_.empty() && token.size() > prefix_.size() && token.compare(0, prefix_.size(), prefix_) == 0) {
      continuing_.emplace(token.substr(prefix_.size()), v);
    }
    memory_bytes_ += 2 * static_cast<int64_t>(token.size() + 48);
  }
  return absl::OkStatus();
}

absl::Status WordPieceTokenizer::LoadModel(const Json& j) {
  if (!j.is_object()) return Bad("model", "must be an object");
  absl::StatusOr<std::string> type = String(j, "model", "type");
  if (!type.ok()) return type.status();
  if (*type != "WordPiece") return NotImplemented("model.type", *type, "WordPiece");
  absl::StatusOr<std::string> unk = String(j, "model", "unk_token");
  if (!unk.ok()) return unk.status();
  unk_ = *unk;
  if (auto p = j.find("continuing_subword_prefix"); p != j.end() && p->is_string()) prefix_ = p->get<std::string>();
  if (auto m = j.find("max_input_chars_per_word"); m != j.end()) {
    if (!m->is_number_unsigned()) return Bad("model.max_input_chars_per_word", "must be a whole number");
    max_chars_ = m->get<size_t>();
  }
  auto vocab = j.find("vocab");
  if (vocab == j.end() || !vocab->is_object()) return Bad("model.vocab", "must be an object of token: id");
  if (absl::Status s = LoadVocabulary(*vocab); !s.ok()) return s;
  auto unk_id = vocab_.find(unk_);
  if (unk_id == vocab_.end())
    return Bad("model.unk_token", absl::StrCat("'", unk_.substr(0, 64), "' is not in the vocabulary"));
  unk_id_ = unk_id->second;
  return absl::OkStatus();
}

absl::Status WordPieceTokenizer::LoadAddedTokens(const Json& j) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_array()) return Bad("added_tokens", "must be an array");
  if (j.size() > kMaxAddedTokens) {
    return Bad("added_tokens", absl::StrCat(j.size(), " tokens, over the limit of ", kMaxAddedTokens));
  }
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    const Json& t = j[i];
    if (!t.is_object()) return Bad(path, "must be an object");
    absl::StatusOr<std::string> content = String(t, path, "content");
    if (!content.ok()) return content.status();
    if (content->empty() || content->size() > kMaxTokenBytes) {
      return Bad(path + ".content", absl::StrCat("must hold 1 to ", kMaxTokenBytes, " bytes"));
    }
    auto id = t.find("id");
    if (id == t.end() || !id->is_number_unsigned() || id->get<uint64_t>() > (uint64_t{1} << 31)) {
      return Bad(path + ".id", "must be a whole number below 2^31");
    }
    for (const char* option : {"normalized", "single_word", "lstrip", "rstrip"}) {
      if (Flag(t, option, false)) {
        return Bad(absl::StrCat(path, ".", option), absl::StrCat("'", content->substr(0, 64), "' asks for ", option,
                                                                 " matching, which is not implemented here"));
      }
    }
    if (absl::Status valid = ValidateUtf8(*content); !valid.ok()) return Bad(path + ".content", valid.message());
    added_.push_back(AddedToken{Decode(*content), *content, id->get<int64_t>(), Flag(t, "special", false)});
    vocabulary_size_ = std::max(vocabulary_size_, id->get<int64_t>() + 1);
  }
  // The longest first: where two start at the same character, the longer one is taken (leftmost-longest).
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.chars.size() > b.chars.size(); });
  return absl::OkStatus();
}

absl::StatusOr<TemplatePiece> WordPieceTokenizer::SpecialPiece(const std::string& path, const std::string& token,
                                                               const Json* ids) const {
  TemplatePiece piece;
  if (ids != nullptr) {
    if (!ids->is_array() || ids->empty()) return Bad(path, "must list the special token's ids");
    for (const Json& id : *ids) {
      if (!id.is_number_unsigned()) return Bad(path, "ids must be whole numbers");
      piece.ids.push_back(id.get<int64_t>());
      piece.tokens.push_back(token);
    }
    return piece;
  }
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return Bad(path, absl::StrCat("'", token.substr(0, 64), "' is not in the vocabulary"));
  piece.ids.push_back(it->second);
  piece.tokens.push_back(token);
  return piece;
}

absl::Status WordPieceTokenizer::LoadBertProcessing(const Json& j) {
  for (const char* side : {"cls", "sep"}) {
    auto pair = j.find(side);
    if (pair == j.end() || !pair->is_array() || pair->size() != 2 || !(*pair)[0].is_string() ||
        !(*pair)[1].is_number_unsigned()) {
      return Bad(absl::StrCat("post_processor.", side), "must be [token, id]");
    }
    if (std::string(side) == "sep") template_.push_back(TemplatePiece{true, {}, {}});
    template_.push_back(TemplatePiece{false, {(*pair)[1].get<int64_t>()}, {(*pair)[0].get<std::string>()}});
  }
  return absl::OkStatus();
}

absl::Status WordPieceTokenizer::LoadPostProcessor(const Json& j) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_object()) return Bad("post_processor", "must be an object (or null)");
  absl::StatusOr<std::string> type = String(j, "post_processor", "type");
  if (!type.ok()) return type.status();
  if (*type == "BertProcessing") return LoadBertProcessing(j);
  if (*type != "TemplateProcessing") {
    return NotImplemented("post_processor.type", *type, "BertProcessing and TemplateProcessing");
  }
  auto single = j.find("single");
  auto specials = j.find("special_tokens");
  if (single == j.end() || !single->is_array()) return Bad("post_processor.single", "must be an array");
  for (size_t i = 0; i < single->size(); ++i) {
    const std::string path = absl::StrCat("post_processor.single[", i, "]");
    const Json& item = (*single)[i];
    if (item.contains("Sequence")) {
      template_.push_back(TemplatePiece{true, {}, {}});
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].is_object()) {
      return Bad(path, "must be a Sequence or a SpecialToken");
    }
    absl::StatusOr<std::string> id = String(item["SpecialToken"], path + ".SpecialToken", "id");
    if (!id.ok()) return id.status();
    const Json* ids = nullptr;
    if (specials != j.end() && specials->is_object() && specials->contains(*id) && (*specials)[*id].contains("ids")) {
      ids = &(*specials)[*id]["ids"];
    }
    absl::StatusOr<TemplatePiece> piece = SpecialPiece(path, *id, ids);
    if (!piece.ok()) return piece.status();
    template_.push_back(*std::move(piece));
  }
  return absl::OkStatus();
}

absl::Status WordPieceTokenizer::Load(const Json& root) {
  if (!root.is_object()) return Bad("(the file)", "must be a JSON object");
  const Json null;
  auto at = [&](const char* key) -> const Json& {
    auto it = root.find(key);
    return it == root.end() ? null : *it;
  };
  if (absl::Status s = LoadModel(at("model")); !s.ok()) return s;
  if (absl::Status s = LoadNormalizer(at("normalizer"), "normalizer", 0); !s.ok()) return s;
  if (absl::Status s = LoadPreTokenizer(at("pre_tokenizer"), "pre_tokenizer", 0); !s.ok()) return s;
  if (absl::Status s = LoadAddedTokens(at("added_tokens")); !s.ok()) return s;
  return LoadPostProcessor(at("post_processor"));
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(std::string_view json) {
  if (json.size() > kMaxJsonBytes) {
    return Bad("(the file)", absl::StrCat(json.size(), " bytes, over the limit of ", kMaxJsonBytes));
  }
  Json root = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Bad("(the file)", "is not valid JSON (or not valid UTF-8)");
  auto model = root.is_object() ? root.find("model") : root.end();
  if (model != root.end() && model->is_object() && model->contains("type") && (*model)["type"].is_string() &&
      (*model)["type"].get<std::string>() != "WordPiece") {
    return NotImplemented("model.type", (*model)["type"].get<std::string>(), "WordPiece");
  }
  auto tokenizer = std::make_unique<WordPieceTokenizer>();
  if (absl::Status s = tokenizer->Load(root); !s.ok()) return s;
  return std::unique_ptr<HfTokenizer>(std::move(tokenizer));
}

}  // namespace qvi::hf

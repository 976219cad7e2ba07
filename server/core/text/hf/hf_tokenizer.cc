// Reading a tokenizer.json (hf_tokenizer.h): each component checked, and what is not implemented refused by name.
#include "server/core/text/hf/hf_tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/core/text/hf/hf_pipeline_tokenizer.h"
#include "server/core/text/tokenizer.h"

namespace qvi::hf {
namespace {

constexpr size_t kMaxAddedTokens = 10'000;
constexpr int kMaxNesting = 16;  // Sequence in Sequence

// The "type" of a component object at `path` ("" for null: none), or why it is not one.
absl::StatusOr<std::string> ComponentType(const Json& j, const std::string& path, int depth) {
  if (j.is_null()) return std::string();
  if (!j.is_object() || depth > kMaxNesting) return Bad(path, "must be an object (or null)");
  return String(j, path, "type");
}

}  // namespace

absl::Status PipelineTokenizer::LoadNormalizer(const Json& j, const std::string& path, int depth) {
  absl::StatusOr<std::string> type = ComponentType(j, path, depth);
  if (!type.ok() || type->empty()) return type.status();
  auto add = [this](NormalizeStep step) { normalize_.emplace_back([step](Normalized* n) { Apply(step, n); }); };
  if (*type == "BertNormalizer") {
    const bool lowercase = Flag(j, "lowercase", true);
    if (Flag(j, "clean_text", true)) add(NormalizeStep::kClean);
    if (Flag(j, "handle_chinese_chars", true)) add(NormalizeStep::kChinese);
    if (Flag(j, "strip_accents", lowercase)) {  // null: as lowercase says
      add(NormalizeStep::kNfd);
      add(NormalizeStep::kStripNonspacing);
    }
    if (lowercase) add(NormalizeStep::kLowercase);
  } else if (*type == "Lowercase") {
    add(NormalizeStep::kLowercase);
  } else if (*type == "NFD") {
    add(NormalizeStep::kNfd);
  } else if (*type == "StripAccents") {
    add(NormalizeStep::kStripCombining);
  } else if (*type == "Precompiled" || *type == "Strip" || *type == "Replace") {
    return LoadSentencePieceNormalizer(j, path, *type);
  } else if (*type == "Sequence") {
    auto steps = j.find("normalizers");
    if (steps == j.end() || !steps->is_array()) return Bad(path + ".normalizers", "must be an array");
    for (size_t i = 0; i < steps->size(); ++i) {
      if (absl::Status s = LoadNormalizer((*steps)[i], absl::StrCat(path, ".normalizers[", i, "]"), depth + 1); !s.ok())
        return s;
    }
  } else {
    return NotImplemented(path + ".type", *type,
                          "BertNormalizer, Lowercase, NFD, StripAccents, Precompiled, Strip, Replace and Sequence");
  }
  return absl::OkStatus();
}

absl::Status PipelineTokenizer::LoadSentencePieceNormalizer(const Json& j, const std::string& path,
                                                            const std::string& type) {
  if (type == "Strip") {
    const bool left = Flag(j, "strip_left", false), right = Flag(j, "strip_right", false);
    normalize_.emplace_back([left, right](Normalized* n) { Strip(left, right, n); });
    return absl::OkStatus();
  }
  if (type == "Replace") {
    auto pattern = j.find("pattern");
    if (pattern == j.end() || !pattern->is_object() || pattern->size() != 1 ||
        !(pattern->contains("String") || pattern->contains("Regex")) || !pattern->begin()->is_string()) {
      return Bad(path + ".pattern", "must be {\"String\": ...} or {\"Regex\": ...}");
    }
    absl::StatusOr<std::string> content = String(j, path, "content");
    if (!content.ok()) return content.status();
    const bool regex = pattern->contains("Regex");
    absl::StatusOr<ReplaceRule> rule = ParseReplace(regex ? "" : pattern->begin()->get<std::string>(),
                                                    regex ? pattern->begin()->get<std::string>() : "", *content, path);
    if (!rule.ok()) return rule.status();
    normalize_.emplace_back([rule = *std::move(rule)](Normalized* n) { Replace(rule, n); });
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> encoded = String(j, path, "precompiled_charsmap");
  if (!encoded.ok()) return encoded.status();
  std::string bytes;
  if (!absl::Base64Unescape(*encoded, &bytes)) return Bad(path + ".precompiled_charsmap", "is not base64");
  absl::StatusOr<std::shared_ptr<const Charsmap>> map = Charsmap::Parse(bytes, path + ".precompiled_charsmap");
  if (!map.ok()) return map.status();
  normalizer_bytes_ += (*map)->MemoryBytes();
  normalize_.emplace_back([map = *std::move(map)](Normalized* n) { map->Apply(n); });
  return absl::OkStatus();
}

absl::Status PipelineTokenizer::LoadPreTokenizer(const Json& j, const std::string& path, int depth) {
  absl::StatusOr<std::string> type = ComponentType(j, path, depth);
  if (!type.ok() || type->empty()) return type.status();
  if (*type == "BertPreTokenizer") {
    pre_tokenize_.push_back(PreTokenizeStep::kWhitespace);
    pre_tokenize_.push_back(PreTokenizeStep::kBertPunctuation);
  } else if (*type == "WhitespaceSplit") {
    pre_tokenize_.push_back(PreTokenizeStep::kWhitespace);
  } else if (*type == "ByteLevel" && depth == 0) {
    byte_level_ = ByteLevel{Flag(j, "add_prefix_space", true), Flag(j, "use_regex", true)};
  } else if (*type == "Metaspace" && depth == 0) {
    return LoadMetaspace(j, path);
  } else if (*type == "Sequence") {
    auto steps = j.find("pretokenizers");
    if (steps == j.end() || !steps->is_array()) return Bad(path + ".pretokenizers", "must be an array");
    for (size_t i = 0; i < steps->size(); ++i) {
      if (absl::Status s = LoadPreTokenizer((*steps)[i], absl::StrCat(path, ".pretokenizers[", i, "]"), depth + 1);
          !s.ok())
        return s;
    }
  } else {
    return NotImplemented(path + ".type", *type,
                          "BertPreTokenizer, WhitespaceSplit, Sequence of these, and ByteLevel or Metaspace alone");
  }
  return absl::OkStatus();
}

absl::Status PipelineTokenizer::LoadMetaspace(const Json& j, const std::string& path) {
  Metaspace m;
  if (auto r = j.find("replacement"); r != j.end()) {
    const std::u32string c =
        r->is_string() && ValidateUtf8(r->get<std::string>()).ok() ? Decode(r->get<std::string>()) : std::u32string();
    if (c.size() != 1) return Bad(path + ".replacement", "must be one character");
    m.replacement = c[0];
  }
  if (auto scheme = j.find("prepend_scheme"); scheme != j.end()) {
    const std::string s = scheme->is_string() ? scheme->get<std::string>() : "";
    if (s == "always") {
      m.prepend = Metaspace::Prepend::kAlways;
    } else if (s == "first") {
      m.prepend = Metaspace::Prepend::kFirst;
    } else if (s == "never") {
      m.prepend = Metaspace::Prepend::kNever;
    } else {
      return Bad(path + ".prepend_scheme", "must be always, first or never");
    }
  } else if (!Flag(j, "add_prefix_space", true)) {  // the older form
    m.prepend = Metaspace::Prepend::kNever;
  }
  m.split = Flag(j, "split", true);
  metaspace_ = m;
  return absl::OkStatus();
}

absl::Status PipelineTokenizer::LoadAddedTokens(const Json& j) {
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
    // Matched on the normalized text, which is the raw text when there is no normalizer.
    const bool normalized = Flag(t, "normalized", false) && !normalize_.empty();
    for (auto [option, set] :
         {std::pair{"normalized", normalized}, std::pair{"single_word", Flag(t, "single_word", false)}}) {
      if (set) {
        return Bad(absl::StrCat(path, ".", option), absl::StrCat("'", content->substr(0, 64), "' asks for ", option,
                                                                 " matching, which is not implemented here"));
      }
    }
    if (absl::Status valid = ValidateUtf8(*content); !valid.ok()) return Bad(path + ".content", valid.message());
    added_.push_back(AddedToken{Decode(*content), *content, id->get<int64_t>(), Flag(t, "special", false),
                                Flag(t, "lstrip", false), Flag(t, "rstrip", false)});
    vocabulary_size_ = std::max(vocabulary_size_, id->get<int64_t>() + 1);
  }
  // The longest first: where two start at the same character, the longer one is taken (leftmost-longest).
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.chars.size() > b.chars.size(); });
  return absl::OkStatus();
}

absl::StatusOr<TemplatePiece> PipelineTokenizer::SpecialPiece(const std::string& path, const std::string& token,
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
  const int64_t id = model_->Id(token);
  if (id < 0) return Bad(path, absl::StrCat("'", token.substr(0, 64), "' is not in the vocabulary"));
  piece.ids.push_back(id);
  piece.tokens.push_back(token);
  return piece;
}

absl::Status PipelineTokenizer::LoadPair(const Json& j, const char* side) {
  auto pair = j.find(side);
  if (pair == j.end() || !pair->is_array() || pair->size() != 2 || !(*pair)[0].is_string() ||
      !(*pair)[1].is_number_unsigned()) {
    return Bad(absl::StrCat("post_processor.", side), "must be [token, id]");
  }
  if (std::string(side) == "sep") template_.push_back(TemplatePiece{true, {}, {}});
  template_.push_back(TemplatePiece{false, {(*pair)[1].get<int64_t>()}, {(*pair)[0].get<std::string>()}});
  return absl::OkStatus();
}

absl::Status PipelineTokenizer::LoadTemplate(const Json& j) {
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

absl::Status PipelineTokenizer::LoadPostProcessor(const Json& j) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_object()) return Bad("post_processor", "must be an object (or null)");
  absl::StatusOr<std::string> type = String(j, "post_processor", "type");
  if (!type.ok()) return type.status();
  if (*type == "TemplateProcessing") return LoadTemplate(j);
  if (*type == "ByteLevel" || *type == "RobertaProcessing") {
    if (Flag(j, "trim_offsets", true)) trim_offsets_ = Flag(j, "add_prefix_space", true);
    if (*type == "ByteLevel") return absl::OkStatus();
  } else if (*type != "BertProcessing") {
    return NotImplemented("post_processor.type", *type,
                          "BertProcessing, RobertaProcessing, TemplateProcessing and ByteLevel");
  }
  if (absl::Status s = LoadPair(j, "cls"); !s.ok()) return s;
  return LoadPair(j, "sep");
}

absl::Status PipelineTokenizer::Load(const Json& root) {
  if (!root.is_object()) return Bad("(the file)", "must be a JSON object");
  const Json null;
  auto at = [&](const char* key) -> const Json& {
    auto it = root.find(key);
    return it == root.end() ? null : *it;
  };
  absl::StatusOr<std::unique_ptr<SubwordModel>> model = LoadModel(at("model"));
  if (!model.ok()) return model.status();
  model_ = *std::move(model);
  vocabulary_size_ = model_->VocabularySize();
  if (absl::Status s = LoadNormalizer(at("normalizer"), "normalizer", 0); !s.ok()) return s;
  if (absl::Status s = LoadPreTokenizer(at("pre_tokenizer"), "pre_tokenizer", 0); !s.ok()) return s;
  if (absl::Status s = LoadAddedTokens(at("added_tokens")); !s.ok()) return s;
  LoadDecoder(at("decoder"));
  return LoadPostProcessor(at("post_processor"));
}

int PipelineTokenizer::SpecialTokensAdded() const {
  int n = 0;
  for (const TemplatePiece& p : template_) n += static_cast<int>(p.ids.size());
  return n;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(std::string_view json) {
  if (json.size() > kMaxJsonBytes) {
    return Bad("(the file)", absl::StrCat(json.size(), " bytes, over the limit of ", kMaxJsonBytes));
  }
  Json root = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Bad("(the file)", "is not valid JSON (or not valid UTF-8)");
  auto tokenizer = std::make_unique<PipelineTokenizer>();
  if (absl::Status s = tokenizer->Load(root); !s.ok()) return s;
  return std::unique_ptr<HfTokenizer>(std::move(tokenizer));
}

}  // namespace qvi::hf

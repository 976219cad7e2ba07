// Decoding ids back to text with a tokenizer.json (hf_tokenizer.h's DecodeIds): each id's token, then the
// file's decoder, as the reference's decoders do token by token (tokenizers' decoders/ and
// pre_tokenizers/metaspace.rs, byte_level.rs); tests/python/test_hf_tokenizer.py compares the two.
#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "server/core/text/hf/hf_models.h"
#include "server/core/text/hf/hf_pipeline_tokenizer.h"
#include "server/core/text/tokenizer.h"

namespace qvi::hf {
namespace {

// WordPiece's cleanup, applied to each token on its own, one replacement after another (as the reference's
// chain of replace calls: a later one sees what an earlier one left).
std::string Cleanup(std::string token) {
  for (const auto& [from, to] : std::initializer_list<std::pair<const char*, const char*>>{{" .", "."},
                                                                                           {" ?", "?"},
                                                                                           {" !", "!"},
                                                                                           {" ,", ","},
                                                                                           {" ' ", "'"},
                                                                                           {" n't", "n't"},
                                                                                           {" 'm", "'m"},
                                                                                           {" do not", " don't"},
                                                                                           {" 's", "'s"},
                                                                                           {" 've", "'ve"},
                                                                                           {" 're", "'re"}}) {
    token = absl::StrReplaceAll(token, {{from, to}});
  }
  return token;
}

// Rust's str::replace of `from` by `to`, an empty `from` included (it matches before each character and at
// the end: "ab".replace("", " ") is " a b ").
std::string ReplaceAll(const std::string& text, const std::string& from, const std::string& to) {
  if (!from.empty()) return absl::StrReplaceAll(text, {{from, to}});
  std::string out = to;
  for (const char32_t c : Decode(text)) {
    AppendUtf8(c, &out);
    out += to;
  }
  return out;
}

// ByteLevel's printable stand-in of each byte, back to the byte.
std::optional<unsigned char> ByteOf(char32_t c) {
  static const absl::flat_hash_map<char32_t, unsigned char> kBytes = [] {
    absl::flat_hash_map<char32_t, unsigned char> bytes;
    for (int b = 0; b < 256; ++b) bytes[ByteChar(static_cast<unsigned char>(b))] = static_cast<unsigned char>(b);
    return bytes;
  }();
  const auto it = kBytes.find(c);
  return it == kBytes.end() ? std::nullopt : std::optional<unsigned char>(it->second);
}

// The length of the UTF-8 sequence lead byte `b` starts (0: none) and its second byte's range (Unicode's
// table 3-7).
size_t SequenceOf(unsigned char b, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) {
    *lo = b == 0xE0 ? 0xA0 : 0x80;
    *hi = b == 0xED ? 0x9F : 0xBF;
    return 3;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    *lo = b == 0xF0 ? 0x90 : 0x80;
    *hi = b == 0xF4 ? 0x8F : 0xBF;
    return 4;
  }
  return 0;
}

// UTF-8 with each ill-formed sequence's maximal valid prefix replaced by one U+FFFD, as Rust's
// from_utf8_lossy does.
std::string Lossy(const std::string& bytes) {
  std::string out;
  const size_t n = bytes.size();
  auto at = [&bytes](size_t k) { return static_cast<unsigned char>(bytes[k]); };
  for (size_t i = 0; i < n;) {
    if (at(i) < 0x80) {
      out.push_back(bytes[i++]);
      continue;
    }
    unsigned char lo = 0, hi = 0;
    const size_t len = SequenceOf(at(i), &lo, &hi);
    size_t k = 1;  // how far the sequence is well formed
    if (len > 0 && i + 1 < n && at(i + 1) >= lo && at(i + 1) <= hi) {
      for (k = 2; k < len && i + k < n && at(i + k) >= 0x80 && at(i + k) <= 0xBF; ++k) {
      }
    }
    if (len > 0 && k == len) {
      out.append(bytes, i, len);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += k;
  }
  return out;
}

// The decoders' ways of joining tokens (tokenizers' decode_chain of each, then the pieces concatenated).
std::string JoinWordPiece(const std::vector<std::string>& tokens, const std::string& prefix, bool cleanup) {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string t = tokens[i];
    if (i != 0) {  // an empty prefix starts every token, as Rust's starts_with("") says
      const bool continues = t.compare(0, prefix.size(), prefix) == 0;
      t = continues ? t.erase(0, prefix.size()) : absl::StrCat(" ", t);
    }
    out += cleanup ? Cleanup(t) : t;
  }
  return out;
}

// Metaspace: ▁ is a space, except in the first token when a space was put before the text (all of its ▁s).
std::string JoinMetaspace(const std::vector<std::string>& tokens, char32_t replacement, bool strip_first) {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (const char32_t c : Decode(tokens[i])) {
      if (c != replacement) {
        AppendUtf8(c, &out);
      } else if (i != 0 || !strip_first) {
        out.push_back(' ');
      }
    }
  }
  return out;
}

// ByteLevel: each token's characters back to bytes (a token with a character that stands for no byte: its own
// UTF-8), then the bytes as text.
std::string JoinByteLevel(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& t : tokens) {
    std::string mine;
    for (const char32_t c : Decode(t)) {
      const std::optional<unsigned char> b = ByteOf(c);
      if (!b.has_value()) {
        mine = t;
        break;
      }
      mine.push_back(static_cast<char>(*b));
    }
    bytes += mine;
  }
  return Lossy(bytes);
}

std::string JoinBpe(const std::vector<std::string>& tokens, const std::string& suffix) {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    out += ReplaceAll(tokens[i], suffix, i + 1 == tokens.size() ? "" : " ");
  }
  return out;
}

}  // namespace

// Metaspace's decoder: its replacement character and whether the first token's ▁s go.
PipelineTokenizer::Decoder MetaspaceDecoder(const Json& j) {
  PipelineTokenizer::Decoder d;
  d.kind = PipelineTokenizer::Decoder::Kind::kMetaspace;
  d.replacement = U'\u2581';
  if (j.contains("replacement") && j["replacement"].is_string()) {
    const std::string r = j["replacement"].get<std::string>();
    const std::u32string c = ValidateUtf8(r).ok() ? Decode(r) : std::u32string();
    if (c.size() == 1) d.replacement = c[0];
    if (c.size() != 1) d.not_implemented = "decoder.replacement is not one character";
  }
  const std::string scheme =
      j.contains("prepend_scheme") && j["prepend_scheme"].is_string() ? j["prepend_scheme"].get<std::string>() : "";
  d.strip_first = j.contains("prepend_scheme") ? scheme != "never" : Flag(j, "add_prefix_space", true);
  return d;
}

void PipelineTokenizer::LoadDecoder(const Json& j) {
  using Kind = Decoder::Kind;
  added_by_id_.clear();
  for (size_t a = 0; a < added_.size(); ++a) added_by_id_.emplace(added_[a].id, a);  // the first of an id
  decoder_ = Decoder{};
  if (j.is_null()) return;
  const std::string type =
      j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
  auto text = [&j](const char* key, const char* otherwise) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string(otherwise);
  };
  if (type == "WordPiece") {
    decoder_.kind = Kind::kWordPiece;
    decoder_.affix = text("prefix", "##");
    decoder_.cleanup = Flag(j, "cleanup", true);
  } else if (type == "Metaspace") {
    decoder_ = MetaspaceDecoder(j);
  } else if (type == "ByteLevel") {
    decoder_.kind = Kind::kByteLevel;
  } else if (type == "BPEDecoder") {
    decoder_.kind = Kind::kBpe;
    decoder_.affix = text("suffix", "</w>");
  } else {
    decoder_.not_implemented = absl::StrCat("decoder.type '", type.substr(0, 64),
                                            "' is not implemented here; WordPiece, Metaspace, ByteLevel and "
                                            "BPEDecoder are (encoding is not affected)");
  }
}

absl::StatusOr<std::string> PipelineTokenizer::DecodeIds(const std::vector<int64_t>& ids,
                                                         bool skip_special_tokens) const {
  if (!decoder_.not_implemented.empty()) return absl::UnimplementedError(decoder_.not_implemented);
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    // An added token's id names it first (as the reference's added vocabulary does), else the model's.
    if (const auto added = added_by_id_.find(id); added != added_by_id_.end()) {
      const AddedToken& a = added_[added->second];
      if (!(skip_special_tokens && a.special)) tokens.push_back(a.content);
    } else if (id >= 0 && id < model_->VocabularySize()) {
      tokens.push_back(model_->Token(id));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("[", i, "]: ", id, " is no token's id (this tokenizer's are below ", vocabulary_size_, ")"));
    }
  }
  using Kind = Decoder::Kind;
  switch (decoder_.kind) {
    case Kind::kWordPiece:
      return JoinWordPiece(tokens, decoder_.affix, decoder_.cleanup);
    case Kind::kMetaspace:
      return JoinMetaspace(tokens, decoder_.replacement, decoder_.strip_first);
    case Kind::kByteLevel:
      return JoinByteLevel(tokens);
    case Kind::kBpe:
      return JoinBpe(tokens, decoder_.affix);
    case Kind::kNone:
      break;
  }
  return absl::StrJoin(tokens, " ");  // no decoder: the tokens, a space between
}

}  // namespace qvi::hf

// The sub-word tokenizer (server/core/text/hf/hf_tokenizer.h): the first byte, modulo 4, picks what the
// rest is. 0: a tokenizer.json, which must load or be refused with INVALID_ARGUMENT, and whatever loads
// must encode a fixed text; 1 to 3: a text, encoded with a small WordPiece tokenizer (BERT's normalizer
// and pre-tokenizer, an added token, a template), a small byte-level BPE one (RoBERTa's processing, a
// <mask> that takes the space before it) or a small Unigram one (SentencePiece's rules as a Precompiled normalizer,
// Strip, Replace, Metaspace), whose tokens must lie inside the text (WordPiece's in order) with ids from the
// vocabulary; their ids, and the text's bytes taken for ids, decode to UTF-8 (or are refused, naming an id).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/core/text/hf/hf_tokenizer.h"
#include "server/core/text/tokenizer.h"
#include "tests/cpp/core/text/charsmap_builder.h"

namespace {

constexpr char kTokenizer[] = R"({"added_tokens": [{"id": 4, "content": "[MASK]", "special": true}],
  "normalizer": {"type": "BertNormalizer", "lowercase": true}, "decoder": {"type": "WordPiece", "prefix": "##"},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[CLS]"}},
    {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "[SEP]"}}]},
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "max_input_chars_per_word": 12, "vocab": {
    "[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "a": 5, "b": 6, "##a": 7, "##b": 8, "ab": 9,
    "!": 10, "東": 11, "e": 12, "##e": 13, "##ab": 14}}})";

constexpr char kBpe[] = R"({"added_tokens": [{"id": 0, "content": "<s>", "special": true},
  {"id": 1, "content": "</s>", "special": true}, {"id": 2, "content": "<mask>", "special": true, "lstrip": true}],
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true}, "decoder": {"type": "ByteLevel"},
  "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 1], "cls": ["<s>", 0], "trim_offsets": true,
    "add_prefix_space": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "vocab": {"<s>": 0, "</s>": 1, "<mask>": 2, "a": 3,
    "b": 4, "Ġ": 5, "Ġa": 6, "ab": 7, "Ġab": 8, "Ã": 9, "©": 10, "Ã©": 11},
    "merges": ["Ġ a", "a b", "Ġa b", "Ã ©"]}})";

constexpr char kUnigram[] = R"({"added_tokens": [{"id": 1, "content": "<mask>", "special": true, "lstrip": true}],
  "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true},
  "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"},
  "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["<mask>", 0.0], ["▁", -2.0], ["▁ab", -3.0],
    ["a", -2.5], ["b", -2.5], ["ab", -4.5], ["c", -3.0], ["▁c", -6.0], ["é", -4.0]]}})";

// kUnigram with SentencePiece's normalizers: the fi ligature expanded, a zero-width space removed, e + acute as one
// cluster, a full-width a, a no-break space, a circled one; trailing spaces stripped, runs of spaces as one ▁.
std::string SentencePiece() {
  nlohmann::json j = nlohmann::json::parse(kUnigram);
  const std::string map = qvi::hf::fixtures::Charsmap({{"\xEF\xAC\x81", "fi"},
                                                       {"\xE2\x80\x8B", ""},
                                                       {"e\xCC\x81", "e"},
                                                       {"\xEF\xBD\x81", "a"},
                                                       {"\xC2\xA0", " "},
                                                       {"\xE2\x91\xA0", "1"}});
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Precompiled"}, {"precompiled_charsmap", map}},
                       {{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}},
                       {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", "\u2581"}}}}};
  return j.dump();
}

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 4 == 0) {
    auto loaded = qvi::hf::HfTokenizer::FromJson(rest);
    if (!loaded.ok()) {
      Check(loaded.status().code() == absl::StatusCode::kInvalidArgument);
      return 0;
    }
    auto encoded = (*loaded)->Encode("A text, with Ünïcödé 東京 and [MASK]!");
    Check(encoded.ok());
    return 0;
  }
  static const auto* wordpiece = qvi::hf::HfTokenizer::FromJson(kTokenizer)->release();
  static const auto* bpe = qvi::hf::HfTokenizer::FromJson(kBpe)->release();
  static const auto* unigram = qvi::hf::HfTokenizer::FromJson(SentencePiece())->release();
  const qvi::hf::HfTokenizer* tokenizer = data[0] % 4 == 1 ? wordpiece : data[0] % 4 == 2 ? bpe : unigram;
  auto encoded = tokenizer->Encode(rest);
  if (!encoded.ok()) return 0;  // not UTF-8
  uint32_t last = 0;
  for (const qvi::hf::SubwordToken& t : *encoded) {
    Check(t.id >= 0 && t.id < tokenizer->VocabularySize());
    if (t.special && t.start == 0 && t.end == 0) continue;
    Check(t.start <= t.end && t.byte_start <= t.byte_end && t.byte_end <= rest.size());
    // In order -- except where trim_offsets moved a lone space token past the next token's start, as the
    // reference does too ("ab\x1b<mask>b": Ġ at 10..10, then b at 9..10).
    Check(t.start >= last || tokenizer == bpe);
    last = t.start;
  }
  // Decoding (DecodeIds, TEI's /decode): the encoded ids, and the bytes read as ids, each decode to valid UTF-8
  // or, an id past the vocabulary, to INVALID_ARGUMENT.
  std::vector<int64_t> ids;
  for (const qvi::hf::SubwordToken& t : *encoded) ids.push_back(t.id);
  std::vector<int64_t> raw(rest.begin(), rest.end());
  for (const auto* list : {&ids, &raw}) {
    for (const bool skip : {true, false}) {
      auto decoded = tokenizer->DecodeIds(*list, skip);
      if (decoded.ok()) {
        Check(qvi::ValidateUtf8(*decoded).ok());
      } else {
        Check(decoded.status().code() == absl::StatusCode::kInvalidArgument);
      }
    }
  }
  return 0;
}

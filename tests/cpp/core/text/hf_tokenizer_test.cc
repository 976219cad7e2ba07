// The sub-word tokenizer's loading and refusals (server/core/text/hf/hf_tokenizer.h). That it tokenizes as
// Hugging Face `tokenizers` does is tests/python/test_hf_tokenizer.py's to show, on tens of thousands of texts;
// here, one text worked by hand, and every way a tokenizer.json is refused, by name.
#include "server/core/text/hf/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "tests/cpp/core/text/charsmap_builder.h"

namespace qvi::hf {
namespace {

using Json = nlohmann::json;

Json Small() {
  return Json::parse(R"({
    "added_tokens": [{"id": 4, "content": "[MASK]", "special": true, "normalized": false}],
    "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                   "strip_accents": null, "lowercase": true},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
      "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                         "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100, "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3,
              "[MASK]": 4, "hello": 5, "cafe": 6, "##s": 7, ",": 8, "東": 9, "京": 10, "!": 11}}})");
}

std::string Refusal(const Json& j) {
  auto t = HfTokenizer::FromJson(j.dump());
  EXPECT_FALSE(t.ok());
  if (t.ok()) return "";
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(t.status().message());
}

TEST(HfTokenizerTest, ATextWorkedByHand) {
  auto t = HfTokenizer::FromJson(Small().dump());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Kind(), "WordPiece");
  EXPECT_EQ((*t)->SpecialTokensAdded(), 2);
  // "Héllo, Cafés東京! [MASK]": accents stripped, lower-cased, CJK split off, "cafés" -> cafe ##s.
  auto e = (*t)->Encode("H\xC3\xA9llo, Caf\xC3\xA9s\xE6\x9D\xB1\xE4\xBA\xAC! [MASK]");
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<int64_t> ids;
  std::vector<std::pair<uint32_t, uint32_t>> offsets, bytes;
  std::vector<int32_t> words;
  for (const SubwordToken& s : *e) {
    ids.push_back(s.id);
    offsets.emplace_back(s.start, s.end);
    bytes.emplace_back(s.byte_start, s.byte_end);
    words.push_back(s.word);
  }
  EXPECT_EQ(ids, (std::vector<int64_t>{2, 5, 8, 6, 7, 9, 10, 11, 4, 3}));
  EXPECT_EQ(offsets, (std::vector<std::pair<uint32_t, uint32_t>>{
                         {0, 0}, {0, 5}, {5, 6}, {7, 11}, {11, 12}, {12, 13}, {13, 14}, {14, 15}, {16, 22}, {0, 0}}));
  EXPECT_EQ(bytes[3], (std::pair<uint32_t, uint32_t>{8, 13})) << "'Café' of 'Cafés': é is two bytes";
  EXPECT_EQ(words, (std::vector<int32_t>{-1, 0, 1, 2, 2, 3, 4, 5, 6, -1}));
  EXPECT_EQ((*e)[4].token, "##s");
  auto unknown = (*t)->Encode("hellos xyz");
  ASSERT_TRUE(unknown.ok());
  ids.clear();
  for (const SubwordToken& s : *unknown) ids.push_back(s.id);
  EXPECT_EQ(ids, (std::vector<int64_t>{2, 5, 7, 1, 3})) << "no piece of 'xyz' is known: the word is [UNK]";
  EXPECT_EQ((*t)->Encode("bad \xFF byte").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HfTokenizerTest, WhatIsNotImplementedIsRefusedByName) {
  Json j = Small();
  j["model"]["type"] = "WordLevel";
  EXPECT_EQ(Refusal(j),
            "tokenizer.json: model.type: type 'WordLevel' is not implemented here (WordPiece, BPE and Unigram are); "
            "the model cannot be served with this tokenizer");
  j = Small();
  j["normalizer"] = Json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "NFKC"}]})");
  EXPECT_EQ(Refusal(j).rfind("tokenizer.json: normalizer.normalizers[1].type: type 'NFKC' is not implemented", 0), 0u);
  j = Small();
  j["normalizer"] = Json::parse(R"({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "})");
  EXPECT_EQ(Refusal(j),
            "tokenizer.json: normalizer.pattern.Regex: type '\\s+' is not implemented here (a String, or a Regex of "
            "one character repeated (' {2,}', ' +') are); the model cannot be served with this tokenizer");
  j = Small();
  j["pre_tokenizer"] = Json::parse(R"({"type": "Digits"})");
  EXPECT_EQ(Refusal(j).rfind("tokenizer.json: pre_tokenizer.type: type 'Digits' is not implemented", 0), 0u);
  j = Small();
  j["pre_tokenizer"] = Json::parse(R"({"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}]})");
  EXPECT_EQ(Refusal(j).rfind("tokenizer.json: pre_tokenizer.pretokenizers[0].type: type 'ByteLevel'", 0), 0u)
      << "ByteLevel only as the whole pre-tokenizer";
  j = Small();
  j["post_processor"] = Json::parse(R"({"type": "Sequence", "processors": []})");
  EXPECT_EQ(Refusal(j).rfind("tokenizer.json: post_processor.type: type 'Sequence'", 0), 0u);
  j = Small();
  j["added_tokens"][0]["single_word"] = true;
  EXPECT_EQ(Refusal(j),
            "tokenizer.json: added_tokens[0].single_word: '[MASK]' asks for single_word matching, which "
            "is not implemented here");
  j = Small();
  j["added_tokens"][0]["normalized"] = true;
  EXPECT_EQ(Refusal(j).rfind("tokenizer.json: added_tokens[0].normalized:", 0), 0u) << "with a normalizer";
}

Json SmallBpe() {
  return Json::parse(R"({"model": {"type": "BPE", "dropout": null, "unk_token": null, "vocab":
    {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "Ġ": 5, "Ġa": 6},
    "merges": ["a b", ["ab", "c"], "Ġ a"]}, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}})");
}

TEST(HfTokenizerTest, BpeMergesByRank) {
  auto t = HfTokenizer::FromJson(SmallBpe().dump());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Kind(), "byte-level BPE");
  auto e = (*t)->Encode("abc ab cab d");
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<int64_t> ids;
  for (const SubwordToken& s : *e) ids.push_back(s.id);
  // "abc" merges whole; " ab" is Ġ + ab (a b ranks before Ġ a); " d": Ġ, and d is in no vocabulary and
  // there is no unknown token, so it is left out -- as tokenizers 0.23.3 answers ([4, 5, 3, 5, 2, 3, 5]).
  EXPECT_EQ(ids, (std::vector<int64_t>{4, 5, 3, 5, 2, 3, 5}));
  EXPECT_EQ((*e)[6].start, 10u);
  EXPECT_EQ((*e)[6].end, 11u);
  // RoBERTa's trimming, as tokenizers 0.23.3 answers: a token of spaces alone is trimmed to nothing, even
  // past the next token's start ((10, 10) then (9, 10), found by the fuzz target); <mask> takes the space
  // before it (3..9), and the \x1b, in no vocabulary and with no unknown token, is left out.
  Json roberta = SmallBpe();
  roberta["pre_tokenizer"]["add_prefix_space"] = true;
  roberta["added_tokens"] = Json::parse(R"([{"id": 7, "content": "<mask>", "special": true, "lstrip": true}])");
  roberta["model"]["vocab"]["<mask>"] = 7;
  roberta["post_processor"] = Json::parse(R"({"type": "RobertaProcessing", "sep": ["c", 2], "cls": ["a", 0]})");
  auto r = HfTokenizer::FromJson(roberta.dump());
  ASSERT_TRUE(r.ok()) << r.status();
  auto trimmed = (*r)->Encode("ab\x1b<mask>b");
  ASSERT_TRUE(trimmed.ok());
  std::vector<std::pair<uint32_t, uint32_t>> offsets;
  ids.clear();
  for (const SubwordToken& s : *trimmed) {
    ids.push_back(s.id);
    offsets.emplace_back(s.start, s.end);
  }
  EXPECT_EQ(ids, (std::vector<int64_t>{0, 5, 3, 7, 5, 1, 2}));
  EXPECT_EQ(offsets,
            (std::vector<std::pair<uint32_t, uint32_t>>{{0, 0}, {0, 0}, {0, 2}, {3, 9}, {10, 10}, {9, 10}, {0, 0}}));
  Json j = SmallBpe();
  j["model"]["dropout"] = 0.1;
  EXPECT_EQ(Refusal(j).rfind("tokenizer.json: model.dropout:", 0), 0u);
  j = SmallBpe();
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(Refusal(j).rfind("tokenizer.json: model.byte_fallback:", 0), 0u);
  j = SmallBpe();
  j["model"]["merges"][1] = "ab d";
  EXPECT_EQ(Refusal(j), "tokenizer.json: model.merges[1]: 'd' is not in the vocabulary");
  j = SmallBpe();
  j["model"]["merges"][0] = "a b c";
  EXPECT_EQ(Refusal(j), "tokenizer.json: model.merges[0]: must be two tokens apart by one space");
}

TEST(HfTokenizerTest, UnigramTakesTheHighestScoringPiecesAndFusesUnknownCharacters) {
  Json j = Json::parse(R"({"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"},
    "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["▁", -2.0], ["▁ab", -3.0], ["a", -2.5],
      ["b", -2.5], ["ab", -4.5], ["c", -3.0], ["▁c", -6.0]]}})");
  auto t = HfTokenizer::FromJson(j.dump());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Kind(), "Unigram");
  // As tokenizers 0.23.3 answers: ▁ + c (-5) beats ▁c (-6); the prepended ▁ is aligned to the first
  // character; x and y, no piece's, are one unknown token.
  for (const auto& [text, want_ids, want_offsets] :
       std::vector<std::tuple<std::string, std::vector<int64_t>, std::vector<std::pair<uint32_t, uint32_t>>>>{
           {"ab cab", {2, 1, 6, 5}, {{0, 2}, {2, 3}, {3, 4}, {4, 6}}},
           {"abxyc", {2, 0, 6}, {{0, 2}, {2, 4}, {4, 5}}},
           {"ab  c", {2, 1, 1, 6}, {{0, 2}, {2, 3}, {3, 4}, {4, 5}}}}) {
    auto e = (*t)->Encode(text);
    ASSERT_TRUE(e.ok()) << e.status();
    std::vector<int64_t> ids;
    std::vector<std::pair<uint32_t, uint32_t>> offsets;
    for (const SubwordToken& s : *e) {
      ids.push_back(s.id);
      offsets.emplace_back(s.start, s.end);
    }
    EXPECT_EQ(ids, want_ids) << text;
    EXPECT_EQ(offsets, want_offsets) << text;
  }
  j["model"]["unk_id"] = nullptr;
  EXPECT_EQ(Refusal(j).rfind("tokenizer.json: model.unk_id: is null", 0), 0u);
  j["model"]["unk_id"] = 99;
  EXPECT_EQ(Refusal(j), "tokenizer.json: model.unk_id: must be an id below the vocabulary's size, 8");
  j["model"]["unk_id"] = 0;
  j["model"]["vocab"][2] = Json::array({"▁ab"});
  EXPECT_EQ(Refusal(j), "tokenizer.json: model.vocab[2]: must be [piece, score]");
  j["model"]["vocab"][2] = Json::array({"▁ab", -3.0});
  j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  EXPECT_EQ(Refusal(j), "tokenizer.json: pre_tokenizer.prepend_scheme: must be always, first or never");
}

TEST(HfTokenizerTest, BrokenFilesAreRefusedNamingTheField) {
  EXPECT_EQ(Refusal(Json::parse("[1, 2]")), "tokenizer.json: (the file): must be a JSON object");
  auto truncated = HfTokenizer::FromJson(Small().dump().substr(0, 100));
  EXPECT_EQ(truncated.status().message(), "tokenizer.json: (the file): is not valid JSON (or not valid UTF-8)");
  std::string bad_utf8 = Small().dump();
  bad_utf8.replace(bad_utf8.find("hello"), 1, "\xC0");
  EXPECT_EQ(HfTokenizer::FromJson(bad_utf8).status().message(),
            "tokenizer.json: (the file): is not valid JSON (or not valid UTF-8)");
  Json j = Small();
  j["model"]["vocab"]["cafe"] = 99;
  EXPECT_EQ(Refusal(j), "tokenizer.json: model.vocab: the id of 'cafe' is not in [0, 12), the vocabulary's size");
  j = Small();
  j["model"]["vocab"]["cafe"] = 5;
  EXPECT_EQ(Refusal(j), "tokenizer.json: model.vocab: id 5 is given to two tokens");
  j = Small();
  j["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(Refusal(j), "tokenizer.json: model.unk_token: '<unk>' is not in the vocabulary");
  j = Small();
  j["model"].erase("vocab");
  EXPECT_EQ(Refusal(j), "tokenizer.json: model.vocab: must be an object of token: id");
  j = Small();
  j["model"]["vocab"].erase("京");
  j["model"]["vocab"][std::string(2000, 'x')] = 10;
  EXPECT_EQ(Refusal(j), "tokenizer.json: model.vocab: a token of 2000 bytes (1 to 1024)");
  j = Small();
  j["post_processor"]["single"][0]["SpecialToken"]["id"] = "[BOS]";
  j["post_processor"].erase("special_tokens");
  EXPECT_EQ(Refusal(j), "tokenizer.json: post_processor.single[0]: '[BOS]' is not in the vocabulary");
  j = Small();
  j["added_tokens"][0]["content"] = "";
  EXPECT_EQ(Refusal(j), "tokenizer.json: added_tokens[0].content: must hold 1 to 1024 bytes");
  Json deep = Json::parse(R"({"type": "Lowercase"})");
  for (int i = 0; i < 20; ++i) deep = Json{{"type", "Sequence"}, {"normalizers", Json::array({deep})}};
  j = Small();
  j["normalizer"] = deep;
  EXPECT_NE(Refusal(j).find("must be an object (or null)"), std::string::npos) << "nesting is bounded";
}

Json WithSentencePieceRules(const std::string& charsmap) {
  Json j = Small();
  j["normalizer"] = Json{
      {"type", "Sequence"},
      {"normalizers", Json::array({Json{{"type", "Precompiled"}, {"precompiled_charsmap", charsmap}},
                                   Json{{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}},
                                   Json{{"type", "Replace"}, {"pattern", {{"Regex", "x{2,}"}}}, {"content", "!"}}})}};
  j["pre_tokenizer"] = Json{{"type", "WhitespaceSplit"}};
  j["post_processor"] = nullptr;
  j["model"]["vocab"]["fi"] = 12;
  j["model"]["vocab"]["##e"] = 13;
  return j;
}

std::vector<std::tuple<int64_t, uint32_t, uint32_t>> Tokens(const HfTokenizer& t, const std::string& text) {
  auto e = t.Encode(text);
  EXPECT_TRUE(e.ok()) << e.status();
  std::vector<std::tuple<int64_t, uint32_t, uint32_t>> out;
  for (const SubwordToken& s : e.value_or(std::vector<SubwordToken>{})) out.emplace_back(s.id, s.start, s.end);
  return out;
}

TEST(HfTokenizerTest, SentencePieceRulesAlignAsTheReferenceDoes) {
  // \uFB01 (the fi ligature) -> "fi"; a zero-width space -> nothing; "e" + U+0301 (one cluster) -> "e". Each
  // expectation is what the pinned `tokenizers` answers for the same charsmap.
  const std::string map = fixtures::Charsmap({{"\xEF\xAC\x81", "fi"}, {"\xE2\x80\x8B", ""}, {"e\xCC\x81", "e"}});
  auto t = HfTokenizer::FromJson(WithSentencePieceRules(map).dump());
  ASSERT_TRUE(t.ok()) << t.status();
  using T = std::tuple<int64_t, uint32_t, uint32_t>;
  EXPECT_EQ(Tokens(**t, "\xEF\xAC\x81 !"), (std::vector<T>{{12, 0, 1}, {11, 2, 3}})) << "both of fi from the ligature";
  EXPECT_EQ(Tokens(**t, "!\xE2\x80\x8B\xE2\x80\x8B !"), (std::vector<T>{{11, 0, 1}, {11, 4, 5}}))
      << "removed characters are charged to the one before them, whose alignment stays its own";
  EXPECT_EQ(Tokens(**t, "\xE2\x80\x8B! !"), (std::vector<T>{{11, 0, 1}, {11, 2, 3}}))
      << "removed first, with nothing before it: every alignment after it shifts back one, as in the reference";
  EXPECT_EQ(Tokens(**t, "fie\xCC\x81 "), (std::vector<T>{{12, 0, 2}, {13, 2, 3}}))
      << "the cluster e + U+0301 becomes e, aligned to the e; the trailing space is stripped";
  EXPECT_EQ(Tokens(**t, "fie\xCC\x81\xCC\x81"), (std::vector<T>{{12, 0, 2}, {13, 2, 3}}))
      << "a key that begins a cluster under six bytes replaces all of it (its other mark is dropped)";
  EXPECT_EQ(Tokens(**t, "fie\xCC\x81\xCC\x81\xCC\x81"), (std::vector<T>{{1, 0, 6}}))
      << "a cluster of six bytes or more is looked up a character at a time: nothing changes, the word is unknown";
  EXPECT_EQ(Tokens(**t, "xxx !"), (std::vector<T>{{11, 2, 3}, {11, 4, 5}})) << "x{2,} -> !, aligned to the last x";
}

TEST(HfTokenizerTest, BrokenCharsmapsAreRefused) {
  const std::string good = fixtures::Charsmap({{"a", "b"}});
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(good, &bytes));
  auto refusal = [](const std::string& raw) { return Refusal(WithSentencePieceRules(absl::Base64Escape(raw))); };
  const std::string at = "tokenizer.json: normalizer.normalizers[0].precompiled_charsmap: ";
  EXPECT_EQ(refusal(bytes.substr(0, 3)), at + "must hold the trie's size and the trie");
  std::string wrong_size = bytes;
  wrong_size[0] = 5;
  EXPECT_EQ(refusal(wrong_size).rfind(at + "the trie's size (", 0), 0u);
  std::string outside = bytes;
  outside[5] = '\x7F';  // the root's offset far past the array
  EXPECT_EQ(refusal(outside), at + "the trie's root points outside it");
  std::string two;
  ASSERT_TRUE(
      absl::Base64Unescape(fixtures::Charsmap({{"a", "\xC3\xA9"}, {"c", "d"}}), &two));  // "é\0d\0": values 0 and 3
  two.replace(two.size() - 5, 5, std::string("\0\0\xC3\xA9\0", 5));                      // 3 is now é's second byte
  EXPECT_EQ(refusal(two), at + "the trie's value 3 is not the start of a replacement");
  EXPECT_EQ(refusal(bytes + "\xFF").rfind(at + "its replacements are not UTF-8", 0), 0u);
  EXPECT_EQ(Refusal([] {
              Json j = WithSentencePieceRules("");
              j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "not base64!";
              return j;
            }()),
            "tokenizer.json: normalizer.normalizers[0].precompiled_charsmap: is not base64");
}

}  // namespace
}  // namespace qvi::hf

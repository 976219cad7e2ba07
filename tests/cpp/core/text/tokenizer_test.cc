// The C++ tokenizer against the vectors shared with the Python reference tokenizer.
#include "server/core/text/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server/core/text/vocabulary.h"

namespace qvi {
namespace {

nlohmann::json LoadVectors() {
  std::ifstream in(std::string(QVI_SOURCE_DIR) + "/tests/data/tokenizer_vectors.json");
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());
}

TEST(TokenizerTest, MatchesSharedVectors) {
  const nlohmann::json data = LoadVectors();
  std::string vocab_text;
  for (const auto& t : data["vocab"]) vocab_text += t.get<std::string>() + "\n";
  absl::StatusOr<Vocabulary> vocab = Vocabulary::Parse(vocab_text);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  ASSERT_GE(data["cases"].size(), 30u);
  for (const auto& c : data["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    TokenizerOptions o;
    o.level = c["config"]["level"] == "char" ? TokenLevel::kChar : TokenLevel::kWord;
    o.lowercase = c["config"]["lowercase"].get<bool>();
    o.max_tokens = c["config"]["max_tokens"].get<int>();
    o.casing = c["config"]["casing"].get<bool>();
    const std::string text = c["text"].get<std::string>();
    absl::StatusOr<std::vector<TextToken>> tokens = Tokenizer(o).Tokenize(text);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    const size_t kept = std::min(tokens->size(), static_cast<size_t>(o.max_tokens));
    EXPECT_EQ(tokens->size() > kept, c["truncated"].get<bool>());
    ASSERT_EQ(kept, c["tokens"].size());
    for (size_t i = 0; i < kept; ++i) {
      const TextToken& t = (*tokens)[i];
      const auto& want = c["tokens"][i];
      EXPECT_EQ(t.text, want[0].get<std::string>()) << "token " << i;
      EXPECT_EQ(t.start, want[1].get<uint32_t>()) << "token " << i;
      EXPECT_EQ(t.end, want[2].get<uint32_t>()) << "token " << i;
      EXPECT_EQ(t.normalized, want[3].get<std::string>()) << "token " << i;
      EXPECT_EQ(text.substr(t.byte_start, t.byte_end - t.byte_start), t.text);
      EXPECT_EQ(TokenId(*vocab, o, t), c["ids"][i].get<int64_t>()) << "token " << i;
      EXPECT_EQ(CaseClass(t.text), c["case_classes"][i].get<int>()) << "token " << i;
    }
  }
}

TEST(TokenizerTest, RejectsInvalidUtf8NamingTheByte) {
  Tokenizer tok(TokenizerOptions{});
  for (const std::string bad : {std::string("ab\xff"), std::string("\xc0\xaf"), std::string("a\xed\xa0\x80"),
                                std::string("\xf4\x90\x80\x80"), std::string("abc\xe2\x82")}) {
    absl::StatusOr<std::vector<TextToken>> r = tok.Tokenize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("invalid UTF-8 at byte"), std::string::npos);
  }
  EXPECT_EQ(ValidateUtf8("ab\xff").message(), "invalid UTF-8 at byte 2");
  EXPECT_TRUE(ValidateUtf8("naïve 北京 👍🏽").ok());
}

TEST(VocabularyTest, ParsesAndRejects) {
  absl::StatusOr<Vocabulary> v = Vocabulary::Parse("[PAD]\n[UNK]\nhello\n");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->Id("hello"), 2);
  EXPECT_EQ(v->Id("nope"), Vocabulary::kUnkId);
  EXPECT_FALSE(Vocabulary::Parse("hello\n[UNK]\n").ok());
  EXPECT_FALSE(Vocabulary::Parse("[PAD]\n[UNK]\na\na\n").ok());
}

}  // namespace
}  // namespace qvi

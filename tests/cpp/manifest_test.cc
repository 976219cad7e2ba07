// Manifest parsing and the errors a bad manifest gets.
#include "server/core/spec/manifest.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace qvi {
namespace {

nlohmann::json Valid() {
  return nlohmann::json::parse(R"({
    "format_version": 1, "name": "m", "task": "tagging",
    "architecture": {"name": "transformer_crf", "display_name": "Transformer-QVI-CRF", "interaction": "qvi",
                     "config": {"layers": 2, "heads": 4}},
    "tags": ["O", "B-PER", "I-PER"], "tag_scheme": "BIO", "entity_types": ["PER"],
    "tokenizer": {"level": "char", "lowercase": false, "max_tokens": 64, "vocab_size": 10},
    "outputs": {"tags": {"shape": ["B", "T"]}, "emissions": {"shape": ["B", "T", "K"]},
                "layer_attention": {"shape": ["B", "L", "H", "T", "T"]}},
    "explanations": ["layer_attention"],
    "serving": {"max_batch_size": 8, "max_batch_tokens": 512, "max_queue_delay_ms": 1.5},
    "model_card": {"description": "test model", "seed": 1}})");
}

TEST(ManifestTest, ParsesEveryField) {
  absl::StatusOr<Manifest> m = Manifest::Parse(Valid().dump());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->task, Task::kTagging);
  EXPECT_EQ(m->tags.size(), 3u);
  EXPECT_EQ(m->tokenizer.level, TokenLevel::kChar);
  EXPECT_FALSE(m->tokenizer.lowercase);
  EXPECT_EQ(m->tokenizer.max_tokens, 64);
  EXPECT_EQ(m->layers, 2);
  EXPECT_EQ(m->heads, 4);
  EXPECT_EQ(m->serving.max_batch_size, 8);
  EXPECT_DOUBLE_EQ(m->serving.max_queue_delay_ms, 1.5);
  EXPECT_EQ(m->description, "test model");
  EXPECT_TRUE(m->HasOutput("layer_attention"));
  EXPECT_FALSE(m->tokenizer.casing) << "a manifest without casing (all before issue 30) has none";
  nlohmann::json cased = Valid();
  cased["tokenizer"]["casing"] = true;
  absl::StatusOr<Manifest> c = Manifest::Parse(cased.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tokenizer.casing);
}

struct BadCase {
  const char* name;
  std::function<void(nlohmann::json&)> edit;
  const char* message;
};

TEST(ManifestTest, ErrorsNameTheField) {
  const std::vector<BadCase> cases = {
      {"format", [](auto& j) { j["format_version"] = 2; }, "field 'format_version' is 2"},
      {"task", [](auto& j) { j["task"] = "summarize"; }, "field 'task' must be 'classification' or 'tagging'"},
      {"scheme", [](auto& j) { j["tag_scheme"] = "IOB9"; }, "field 'tag_scheme' must be BIO or BIOES"},
      {"no tags", [](auto& j) { j.erase("tags"); }, "field 'tags' is missing"},
      {"typeless tag",
       [](auto& j) {
         j["tags"] = {"O", "B-PER", "I-"};
       },
       "field 'tags[2]' is not O or one of BIO's BI"},
      {"scheme's prefix",
       [](auto& j) {
         j["tags"] = {"O", "E-PER"};
       },
       "field 'tags[1]' is not O"},
      {"level", [](auto& j) { j["tokenizer"]["level"] = "byte"; }, "field 'tokenizer.level' must be"},
      {"max tokens", [](auto& j) { j["tokenizer"]["max_tokens"] = 0; },
       "field 'tokenizer.max_tokens' must be at least 1"},
      {"type", [](auto& j) { j["tokenizer"]["lowercase"] = "yes"; }, "field 'tokenizer.lowercase' has the wrong type"},
      {"casing", [](auto& j) { j["tokenizer"]["casing"] = 1; }, "field 'tokenizer.casing' has the wrong type"},
      {"outputs", [](auto& j) { j["outputs"].erase("tags"); }, "field 'outputs' lacks 'tags'"},
      {"layers", [](auto& j) { j["architecture"]["config"]["layers"] = "two"; },
       "field 'architecture.config.layers' has the wrong type"},
  };
  for (const BadCase& c : cases) {
    nlohmann::json j = Valid();
    c.edit(j);
    absl::StatusOr<Manifest> m = Manifest::Parse(j.dump());
    ASSERT_FALSE(m.ok()) << c.name;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(m.status().message().find(c.message), std::string::npos) << c.name << ": " << m.status().message();
  }
  EXPECT_FALSE(Manifest::Parse("not json").ok());
  EXPECT_FALSE(Manifest::Parse("[1, 2]").ok());
}

}  // namespace
}  // namespace qvi

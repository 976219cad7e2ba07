// Manifest parsing and the errors a bad manifest gets.
#include "server/core/manifest/manifest.h"

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

// A tokenizer block as `python -m qvi import` writes it (format 2).
nlohmann::json SubwordTokenizer() {
  return nlohmann::json::parse(R"({"level": "subword", "file": "tokenizer.json", "kind": "WordPiece",
    "lowercase": false, "max_tokens": 128, "vocab_size": 30522, "word_tags": "first_subword"})");
}

TEST(ManifestTest, FormatTwoReadsASubwordTokenizerAndOneStillLoads) {
  nlohmann::json j = Valid();
  j["format_version"] = 2;
  j["tokenizer"] = SubwordTokenizer();
  j["architecture"]["name"] = "hf_bert";
  absl::StatusOr<Manifest> m = Manifest::Parse(j.dump());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->subwords());
  EXPECT_EQ(m->tokenizer_file, "tokenizer.json");
  EXPECT_EQ(m->tokenizer_kind, "WordPiece");
  EXPECT_EQ(m->word_tags, "first_subword");
  EXPECT_EQ(m->vocab_size, 30522);
  EXPECT_EQ(m->layers, 2) << "an imported encoder's layers and heads are read as a Transformer's";
  absl::StatusOr<Manifest> old = Manifest::Parse(Valid().dump());
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_FALSE(old->subwords());
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
  EXPECT_FALSE(m->serving_cuda.has_value()) << "no serving.cuda: the GPU defaults apply";
  EXPECT_EQ(m->description, "test model");
  EXPECT_TRUE(m->HasOutput("layer_attention"));
  EXPECT_FALSE(m->tokenizer.casing) << "a manifest without casing (all before issue 30) has none";
  nlohmann::json cased = Valid();
  cased["tokenizer"]["casing"] = true;
  absl::StatusOr<Manifest> c = Manifest::Parse(cased.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tokenizer.casing);
  nlohmann::json gpu = Valid();
  gpu["serving"]["cuda"] = {{"max_batch_size", 128}};
  absl::StatusOr<Manifest> g = Manifest::Parse(gpu.dump());
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(g->serving_cuda.has_value());
  EXPECT_EQ(g->serving_cuda->max_batch_size, 128);
  EXPECT_EQ(g->serving_cuda->max_batch_tokens, defaults::kGpuMaxBatchTokens) << "unset keys: the GPU defaults";
  EXPECT_EQ(g->serving.max_batch_size, 8) << "the CPU's stays";
}

// A card's faithfulness block as model_store/qvi/faithfulness.py's card_summary writes it.
nlohmann::json Faithfulness() {
  return nlohmann::json::parse(R"({
    "split": "data/conll2003/test.conll", "answers": 5648, "texts": 3453, "removal": "delete",
    "target": "mean CRF marginal of the predicted entity's tags", "ks": [1, 5, 10, 20, 50],
    "methods": [
      {"method": "random", "name": "random", "comprehensiveness": {"mean": 0.05, "low": 0.04, "high": 0.06},
       "sufficiency": {"mean": 0.17, "low": 0.16, "high": 0.18},
       "normalised_comprehensiveness": {"mean": 0.2, "low": 0.19, "high": 0.21},
       "loo_spearman": {"mean": 0.01, "low": -0.01, "high": 0.03}},
      {"method": "alpha", "name": "α", "comprehensiveness": {"mean": 0.31, "low": 0.28, "high": 0.34},
       "sufficiency": {"mean": 0.1, "low": 0.09, "high": 0.11},
       "normalised_comprehensiveness": {"mean": 0.6, "low": 0.58, "high": 0.62},
       "vs_random": {"mean": 0.26, "low": 0.23, "high": 0.29, "p": 1e-30},
       "cost": {"ms_per_text_batch_1": 2.5, "ms_per_text_batch_32": 0.25, "extra_forwards_per_text": 0}}],
    "cost_machine": "x86_64, 2 torch threads"})");
}

TEST(ManifestTest, ReadsTheCardsFaithfulnessFigures) {
  absl::StatusOr<Manifest> none = Manifest::Parse(Valid().dump());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->faithfulness.has_value()) << "a card without figures: not measured";
  nlohmann::json j = Valid();
  j["model_card"]["faithfulness"] = Faithfulness();
  absl::StatusOr<Manifest> m = Manifest::Parse(j.dump());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->faithfulness.has_value());
  const FaithfulnessCard& f = *m->faithfulness;
  EXPECT_EQ(f.answers, 5648);
  EXPECT_EQ(f.texts, 3453);
  EXPECT_EQ(f.ks, (std::vector<int>{1, 5, 10, 20, 50}));
  ASSERT_EQ(f.methods.size(), 2u);
  EXPECT_EQ(f.methods[0].method, "random");
  EXPECT_FALSE(f.methods[0].vs_random.has_value());
  ASSERT_TRUE(f.methods[0].loo_spearman.has_value());
  EXPECT_EQ(f.methods[1].name, "α");
  EXPECT_DOUBLE_EQ(f.methods[1].comprehensiveness.low, 0.28);
  ASSERT_TRUE(f.methods[1].vs_random.has_value());
  EXPECT_DOUBLE_EQ(f.methods[1].vs_random->mean, 0.26);
  EXPECT_DOUBLE_EQ(f.methods[1].vs_random_p, 1e-30);
  EXPECT_FALSE(f.methods[1].loo_spearman.has_value());
  EXPECT_FALSE(f.methods[0].cost.has_value()) << "a method without a cost: not measured";
  ASSERT_TRUE(f.methods[1].cost.has_value());
  EXPECT_DOUBLE_EQ(f.methods[1].cost->ms_per_text_batch_1, 2.5);
  EXPECT_DOUBLE_EQ(f.methods[1].cost->ms_per_text_batch_32, 0.25);
  EXPECT_DOUBLE_EQ(f.methods[1].cost->extra_forwards_per_text, 0);
  EXPECT_EQ(f.cost_machine, "x86_64, 2 torch threads");
}

// A card's calibration block as model_store/qvi/calibration.py writes it (levels out of order here).
nlohmann::json Calibration() {
  return nlohmann::json::parse(R"({"fitted_on": "data/sentiment/dev.tsv", "measured_on": "data/sentiment/test.tsv",
    "temperature": 1.8, "method": "temperature", "bins": 15,
    "before": {"ece": 0.082, "brier": 0.31, "reliability": [[0.6, 0.55, 0.5, 10]]},
    "after": {"ece": 0.028, "brier": 0.295},
    "conformal": [{"coverage_target": 0.95, "min_probability": 0.22, "coverage": 0.946, "mean_set_size": 1.46},
                  {"coverage_target": 0.9, "min_probability": 0.31, "coverage": 0.903, "mean_set_size": 1.3}]})");
}

TEST(ManifestTest, ReadsTheCardsCalibration) {
  absl::StatusOr<Manifest> none = Manifest::Parse(Valid().dump());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->calibration.has_value());
  EXPECT_EQ(none->ScoreTemperature(false), 1.0) << "no calibration: raw scores";
  nlohmann::json j = Valid();
  j["model_card"]["calibration"] = Calibration();
  absl::StatusOr<Manifest> m = Manifest::Parse(j.dump());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->calibration.has_value());
  EXPECT_EQ(m->ScoreTemperature(false), 1.8);
  EXPECT_EQ(m->ScoreTemperature(/*raw=*/true), 1.0);
  EXPECT_EQ(m->calibration->fitted_on, "data/sentiment/dev.tsv");
  EXPECT_DOUBLE_EQ(m->calibration->ece_after, 0.028);
  ASSERT_EQ(m->calibration->conformal.size(), 2u);
  EXPECT_EQ(m->calibration->conformal[0].coverage_target, 0.9) << "ascending";
  EXPECT_EQ(m->calibration->conformal[1].min_probability, 0.22);
}

// A card's drift reference as model_store/qvi/drift.py writes it.
nlohmann::json Drift() {
  return nlohmann::json::parse(R"({"split": "data/sentiment/test.tsv", "texts": 1276, "answers": 1276,
    "labels": {"negative": 0.48, "positive": 0.52}, "unknown": 0.018,
    "length": {"edges": [8, 12.5, 20], "shares": [0.1, 0.3, 0.4, 0.2]},
    "confidence": {"edges": [0.6, 0.9], "shares": [0.2, 0.5, 0.3], "temperature": 1.8},
    "below": {"threshold": 0.9, "share": 0.7}})");
}

TEST(ManifestTest, ReadsTheCardsDriftReference) {
  EXPECT_FALSE(Manifest::Parse(Valid().dump())->drift_reference.has_value());
  nlohmann::json j = Valid();
  j["model_card"]["drift_reference"] = Drift();
  absl::StatusOr<Manifest> m = Manifest::Parse(j.dump());
  ASSERT_TRUE(m.ok()) << m.status();
  const DriftReference& d = *m->drift_reference;
  EXPECT_EQ(d.texts, 1276);
  EXPECT_EQ(d.labels.at("positive"), 0.52);
  EXPECT_EQ(d.length.Bin(3), 0u);
  EXPECT_EQ(d.length.Bin(12.5), 2u) << "a value on an edge is past it";
  EXPECT_EQ(d.length.Bin(400), 3u);
  EXPECT_EQ(d.temperature, 1.8);
  EXPECT_EQ(d.below_share, 0.7);
}

struct BadCase {
  const char* name;
  std::function<void(nlohmann::json&)> edit;
  const char* message;
};

TEST(ManifestTest, ErrorsNameTheField) {
  const std::vector<BadCase> cases = {
      {"format", [](auto& j) { j["format_version"] = 3; },
       "field 'format_version' is 3; this server reads versions 1 to 2"},
      {"format 0", [](auto& j) { j["format_version"] = 0; }, "field 'format_version' is 0"},
      {"subword in format 1", [](auto& j) { j["tokenizer"] = SubwordTokenizer(); },
       "field 'tokenizer.level' 'subword' needs format_version 2"},
      {"subword file",
       [](auto& j) {
         j["format_version"] = 2;
         j["tokenizer"] = SubwordTokenizer();
         j["tokenizer"]["file"] = "../etc/passwd";
       },
       "field 'tokenizer.file' must be 'tokenizer.json'"},
      {"subword tagger's word tags",
       [](auto& j) {
         j["format_version"] = 2;
         j["tokenizer"] = SubwordTokenizer();
         j["tokenizer"]["word_tags"] = "last_subword";
       },
       "field 'tokenizer.word_tags' must be 'first_subword'"},
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
      {"serving.cuda", [](auto& j) { j["serving"]["cuda"] = 256; }, "field 'serving.cuda' must be an object"},
      {"serving.cuda key",
       [](auto& j) {
         j["serving"]["cuda"] = {{"max_batch_size", "big"}};
       },
       "field 'serving.cuda.max_batch_size' has the wrong type"},
      {"layers", [](auto& j) { j["architecture"]["config"]["layers"] = "two"; },
       "field 'architecture.config.layers' has the wrong type"},
      {"faithfulness",
       [](auto& j) {
         j["model_card"]["faithfulness"] = Faithfulness();
         j["model_card"]["faithfulness"]["methods"][1]["comprehensiveness"].erase("low");
       },
       "field 'model_card.faithfulness.methods[1].comprehensiveness.low' is missing"},
      {"faithfulness methods",
       [](auto& j) {
         j["model_card"]["faithfulness"] = Faithfulness();
         j["model_card"]["faithfulness"]["methods"] = "alpha";
       },
       "field 'model_card.faithfulness.methods' is missing or not a list"},
      {"method cost",
       [](auto& j) {
         j["model_card"]["faithfulness"] = Faithfulness();
         j["model_card"]["faithfulness"]["methods"][1]["cost"]["ms_per_text_batch_32"] = -1;
       },
       "field 'model_card.faithfulness.methods[1].cost.ms_per_text_batch_32' must be a number at least 0"},
      {"method cost's forwards",
       [](auto& j) {
         j["model_card"]["faithfulness"] = Faithfulness();
         j["model_card"]["faithfulness"]["methods"][1]["cost"].erase("extra_forwards_per_text");
       },
       "field 'model_card.faithfulness.methods[1].cost.extra_forwards_per_text' is missing"},
      {"temperature",
       [](auto& j) {
         j["model_card"]["calibration"] = Calibration();
         j["model_card"]["calibration"]["temperature"] = 0;
       },
       "field 'model_card.calibration.temperature' must be above 0"},
      {"drift bins",
       [](auto& j) {
         j["model_card"]["drift_reference"] = Drift();
         j["model_card"]["drift_reference"]["length"]["shares"] = {0.5, 0.5};
       },
       "field 'model_card.drift_reference.length.shares' has 2 bins; its 3 edges make 4"},
      {"drift edges",
       [](auto& j) {
         j["model_card"]["drift_reference"] = Drift();
         j["model_card"]["drift_reference"]["confidence"]["edges"] = {0.9, 0.6};
       },
       "field 'model_card.drift_reference.confidence.edges[1]' must be in [0, 1] and above the one before"},
      {"drift threshold",
       [](auto& j) {
         j["model_card"]["drift_reference"] = Drift();
         j["model_card"]["drift_reference"].erase("below");
       },
       "field 'model_card.drift_reference.below' is missing"},
      {"calibration's ECE",
       [](auto& j) {
         j["model_card"]["calibration"] = Calibration();
         j["model_card"]["calibration"]["after"].erase("ece");
       },
       "field 'model_card.calibration.after.ece' is missing"},
      {"conformal level",
       [](auto& j) {
         j["model_card"]["calibration"] = Calibration();
         j["model_card"]["calibration"]["conformal"][1]["coverage_target"] = 1.5;
       },
       "field 'model_card.calibration.conformal[1].coverage_target' must be in (0, 1)"},
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

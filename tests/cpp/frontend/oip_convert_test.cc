// The Open Inference Protocol conversions (server/frontend/oip/tensors.h) on their own: how a
// ModelInfer request's texts, parameters and outputs are read (and refused, naming the field), and
// the raw layout of every output tensor. The tests against the running server with tritonclient
// and KServe's client are in tests/python/test_oip.py.
#include "server/frontend/oip/tensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

namespace qvi::oip {
namespace {

using inference::ModelInferRequest;
using inference::ModelInferResponse;

Manifest Classifier() {
  Manifest m;
  m.name = "sentiment";
  m.task = Task::kClassification;
  m.labels = {"negative", "neutral", "positive"};
  m.outputs = {{"logits", {"B", "C"}}, {"attention", {"B", "T"}}, {"gates", {"B", "T"}}};
  m.tokenizer.max_tokens = 4;
  return m;
}

Manifest Tagger() {
  Manifest m;
  m.name = "ner";
  m.task = Task::kTagging;
  m.tags = {"O", "B-PER", "I-PER"};
  m.outputs = {{"tags", {"B", "T"}},
               {"emissions", {"B", "T", "K"}},
               {"attention", {"B", "T"}},
               {"layer_attention", {"B", "L", "H", "T", "T"}},
               {"layer_gates", {"B", "L", "H", "T"}}};
  m.tokenizer.max_tokens = 8;
  return m;
}

std::string Raw(const std::vector<std::string>& texts) {
  std::string raw;
  for (const std::string& t : texts) {
    const uint32_t n = static_cast<uint32_t>(t.size());
    for (int b = 0; b < 4; ++b) raw.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
    raw += t;
  }
  return raw;
}

ModelInferRequest Request(const std::vector<std::string>& texts) {
  ModelInferRequest r;
  r.set_model_name("sentiment");
  auto* input = r.add_inputs();
  input->set_name("text");
  input->set_datatype("BYTES");
  input->add_shape(static_cast<int64_t>(texts.size()));
  r.add_raw_input_contents(Raw(texts));
  return r;
}

// A plan for a version served with the server's defaults (no serving.json).
absl::StatusOr<InferPlan> PlanOf(const ModelInferRequest& r, const Manifest& m) {
  return FromModelInfer(r, m, ServingConfig{});
}

std::string Error(const absl::StatusOr<InferPlan>& plan) {
  EXPECT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(plan.status().message());
}

std::vector<std::string> Names(const InferPlan& plan) {
  std::vector<std::string> names;
  for (const RequestedOutput& o : plan.outputs) names.push_back(o.name());
  return names;
}

// serving.json's abstain_below judges a request whose parameters set none: its default answer carries the
// "abstained" tensor, which it may also name; its own parameter, or raw_scores, wins.
TEST(OipConvertTest, AModelsDefaultThresholdBringsTheAbstainedTensor) {
  ServingConfig serving;
  serving.abstain_below = 0.7;
  auto plan = FromModelInfer(Request({"a good film"}), Classifier(), serving);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->request.options.abstain_below, 0.7);
  EXPECT_EQ(Names(*plan), (std::vector<std::string>{"label", "probabilities", "abstained"}));
  ModelInferRequest named = Request({"a good film"});
  named.add_outputs()->set_name("abstained");
  plan = FromModelInfer(named, Classifier(), serving);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Names(*plan), (std::vector<std::string>{"abstained"}));
  EXPECT_EQ(Error(PlanOf(named, Classifier())), "outputs[0].name: 'abstained' needs parameters.abstain_below");
  ModelInferRequest own = Request({"a good film"});
  (*own.mutable_parameters())["abstain_below"].set_double_param(0.2);
  EXPECT_EQ(FromModelInfer(own, Classifier(), serving)->request.options.abstain_below, 0.2);
  ModelInferRequest raw = Request({"a good film"});
  (*raw.mutable_parameters())["raw_scores"].set_bool_param(true);
  plan = FromModelInfer(raw, Classifier(), serving);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->request.options.abstain_below.has_value());
  EXPECT_EQ(Names(*plan), (std::vector<std::string>{"label", "probabilities"}));
}

TEST(OipConvertTest, ReadsRawAndListedTextsAlike) {
  ModelInferRequest raw = Request({"a good film", "", "ünïcödé 👍"});
  raw.set_id("id-7");
  raw.set_model_version("2");
  auto plan = PlanOf(raw, Classifier());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->request.texts, (std::vector<std::string>{"a good film", "", "ünïcödé 👍"}));
  EXPECT_EQ(plan->request.version, 2);
  EXPECT_EQ(plan->request.request_id, "id-7");
  EXPECT_EQ(plan->method, Method::kClassify);

  ModelInferRequest listed = Request({});
  listed.clear_raw_input_contents();
  listed.mutable_inputs(0)->set_shape(0, 2);
  listed.mutable_inputs(0)->mutable_contents()->add_bytes_contents("one");
  listed.mutable_inputs(0)->mutable_contents()->add_bytes_contents("two");
  plan = PlanOf(listed, Classifier());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->request.texts, (std::vector<std::string>{"one", "two"}));

  ModelInferRequest column = Request({"x", "y"});  // [N, 1], as tritonclient examples often shape it
  column.mutable_inputs(0)->add_shape(1);
  EXPECT_TRUE(PlanOf(column, Classifier()).ok());
}

TEST(OipConvertTest, RefusesMalformedRawContentsNamingTheElement) {
  ModelInferRequest r = Request({"abc"});
  r.set_raw_input_contents(0, r.raw_input_contents(0).substr(0, 5));  // 3 bytes promised, 1 there
  EXPECT_EQ(Error(PlanOf(r, Classifier())), "raw_input_contents[0]: element 0 is 3 bytes, past the end of the buffer");
  r = Request({"abc"});
  r.set_raw_input_contents(0, r.raw_input_contents(0) + "\x01\x00");
  EXPECT_EQ(Error(PlanOf(r, Classifier())),
            "raw_input_contents[0]: element 1 has an incomplete 4-byte length at byte 7");
  r = Request({"a", "b", "c"});
  r.mutable_inputs(0)->set_shape(0, 2);
  EXPECT_EQ(Error(PlanOf(r, Classifier())), "raw_input_contents[0]: holds more than the 2 elements of inputs[0].shape");
  r = Request({"a"});
  r.mutable_inputs(0)->set_shape(0, 1000000000000);  // a shape the buffer cannot hold reserves nothing large
  EXPECT_EQ(Error(PlanOf(r, Classifier())), "inputs[0]: holds 1 elements, but its shape promises 1000000000000");
  r = Request({"a"});
  r.add_raw_input_contents("x");
  EXPECT_EQ(Error(PlanOf(r, Classifier())), "raw_input_contents: 2 buffers for 1 input");
  r = Request({"a"});
  r.mutable_inputs(0)->mutable_contents()->add_bytes_contents("b");
  EXPECT_EQ(Error(PlanOf(r, Classifier())),
            "inputs[0].contents: set beside raw_input_contents; send the texts in one of the two");
  r = Request({"a"});
  r.clear_raw_input_contents();
  r.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1.0f);
  EXPECT_EQ(Error(PlanOf(r, Classifier())),
            "inputs[0].contents: 'text' is BYTES; send the texts as bytes_contents or raw_input_contents");
}

TEST(OipConvertTest, RefusesInputsThatAreNotOneTextTensor) {
  ModelInferRequest r = Request({"a"});
  r.mutable_inputs(0)->set_name("TEXT");
  EXPECT_EQ(Error(PlanOf(r, Classifier())),
            "inputs[0].name: 'TEXT' is not an input of model 'sentiment'; its input is 'text'");
  r = Request({"a"});
  r.mutable_inputs(0)->set_datatype("FP32");
  EXPECT_EQ(Error(PlanOf(r, Classifier())), "inputs[0].datatype: 'FP32'; 'text' is BYTES (UTF-8 texts)");
  r = Request({"a"});
  r.mutable_inputs(0)->add_shape(2);
  EXPECT_EQ(Error(PlanOf(r, Classifier())), "inputs[0].shape: [1, 2]; 'text' is [N] (or [N, 1]): N texts");
  r = Request({"a"});
  r.mutable_inputs(0)->set_shape(0, -1);
  EXPECT_EQ(Error(PlanOf(r, Classifier())), "inputs[0].shape: [-1]; 'text' is [N] (or [N, 1]): N texts");
  r = Request({"a"});
  *r.add_inputs() = r.inputs(0);
  EXPECT_EQ(Error(PlanOf(r, Classifier())),
            "inputs: model 'sentiment' takes one input, 'text' (BYTES [N]); the request has 2");
  r = Request({"a"});
  (*r.mutable_inputs(0)->mutable_parameters())["shared_memory_region"].set_string_param("r");
  EXPECT_EQ(Error(PlanOf(r, Classifier())),
            "inputs[0].parameters.shared_memory_region: input parameters (shared memory among them) are not supported");
  r = Request({"a"});
  (*r.mutable_inputs(0)->mutable_parameters())["binary_data_size"].set_int64_param(5);  // KServe's: ignored
  EXPECT_TRUE(PlanOf(r, Classifier()).ok());
  r = Request({"a"});
  r.set_model_version("v2");
  EXPECT_EQ(Error(PlanOf(r, Classifier())),
            "model_version: 'v2' is not a version (a positive integer, or empty for the newest ready version)");
}

TEST(OipConvertTest, ParametersSetTheOptionsAndAreChecked) {
  ModelInferRequest r = Request({"a"});
  auto& p = *r.mutable_parameters();
  p["top_k"].set_int64_param(9);  // more than the labels: all of them
  p["attention"].set_bool_param(true);
  p["truncation"].set_string_param("error");
  p["layers"].set_string_param("0, 2");
  p["heads"].set_int64_param(1);
  p["reduction"].set_string_param("mean_all");
  p["timeout"].set_int64_param(2500);
  auto plan = PlanOf(r, Classifier());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const OutputOptions& o = plan->request.options;
  EXPECT_EQ(plan->top_k, 3);
  EXPECT_EQ(o.top_k, 3);  // every label's probability is read
  EXPECT_TRUE(o.Asks(OutputSwitch::kAttention));
  EXPECT_FALSE(o.Asks(OutputSwitch::kGates));
  EXPECT_TRUE(o.error_on_truncation);
  EXPECT_EQ(o.layers.layers, (std::vector<int>{0, 2}));
  EXPECT_EQ(o.layers.heads, (std::vector<int>{1}));
  EXPECT_EQ(o.layers.reduction, LayerSelection::Reduction::kMeanAll);
  EXPECT_EQ(plan->timeout, absl::Microseconds(2500));
  EXPECT_EQ(Names(*plan), (std::vector<std::string>{"label", "probabilities", "token_count", "attention"}));

  const std::vector<std::pair<std::function<void(inference::InferParameter&)>, std::string>> bad = {
      {[](auto& v) { v.set_string_param("2"); }, "parameters.top_k: must be an int64"},
      {[](auto& v) { v.set_int64_param(-1); }, "parameters.top_k: -1 is negative"},
  };
  for (const auto& [set, message] : bad) {
    ModelInferRequest b = Request({"a"});
    set((*b.mutable_parameters())["top_k"]);
    EXPECT_EQ(Error(PlanOf(b, Classifier())), message);
  }
  ModelInferRequest b = Request({"a"});
  (*b.mutable_parameters())["gates"].set_int64_param(1);
  EXPECT_EQ(Error(PlanOf(b, Classifier())), "parameters.gates: must be a bool");
  b = Request({"a"});
  (*b.mutable_parameters())["layers"].set_string_param("0,x");
  EXPECT_EQ(Error(PlanOf(b, Classifier())), "parameters.layers: 'x' is not an index (want e.g. \"0,2\")");
  b = Request({"a"});
  (*b.mutable_parameters())["reduction"].set_string_param("max");
  EXPECT_EQ(Error(PlanOf(b, Classifier())),
            "parameters.reduction: 'max'; want \"none\", \"mean_heads\" or \"mean_all\"");
  b = Request({"a"});
  (*b.mutable_parameters())["timeout"].set_int64_param(0);
  EXPECT_EQ(Error(PlanOf(b, Classifier())), "parameters.timeout: 0 µs is not positive");
  b = Request({"a"});
  (*b.mutable_parameters())["priority"].set_uint64_param(4);
  EXPECT_EQ(Error(PlanOf(b, Classifier())),
            "parameters.priority: 4 is not a priority; it takes 0 or \"default\", 1 or \"high\", 2 or \"normal\", "
            "3 or \"low\"");
  b = Request({"a"});
  (*b.mutable_parameters())["priority"].set_string_param("high");
  EXPECT_EQ(Error(PlanOf(b, Classifier())), "parameters.priority: must be an int64");
  b = Request({"a"});
  (*b.mutable_parameters())["raw_scores"].set_bool_param(true);
  ASSERT_TRUE(PlanOf(b, Classifier()).ok());
  EXPECT_TRUE(PlanOf(b, Classifier())->request.options.raw_scores);
  b = Request({"a"});
  (*b.mutable_parameters())["coverage"].set_double_param(0.9);
  (*b.mutable_parameters())["abstain_below"].set_int64_param(1);
  ASSERT_TRUE(PlanOf(b, Classifier()).ok());
  EXPECT_EQ(PlanOf(b, Classifier())->request.options.coverage, 0.9);
  EXPECT_EQ(PlanOf(b, Classifier())->request.options.abstain_below, 1.0);
  b = Request({"a"});
  (*b.mutable_parameters())["coverage"].set_string_param("0.9");
  EXPECT_EQ(Error(PlanOf(b, Classifier())), "parameters.coverage: must be a double");
  b = Request({"a"});
  b.add_outputs()->set_name("label_set");
  EXPECT_EQ(Error(PlanOf(b, Classifier())), "outputs[0].name: 'label_set' needs parameters.coverage");
  b = Request({"a"});
  (*b.mutable_parameters())["priorty"].set_int64_param(1);
  EXPECT_EQ(Error(PlanOf(b, Classifier())),
            "parameters.priorty: not a parameter of ModelInfer (abstain_below, attention, contributions, coverage, "
            "faithfulness_top_k, gates, heads, layer_attention, layer_gates, layers, occlusion, priority, "
            "raw_scores, reduction, subwords, timeout, tokens, top_k, truncation)");
  b = Request({"a"});
  (*b.mutable_parameters())["subwords"].set_bool_param(true);
  absl::StatusOr<InferPlan> subwords = PlanOf(b, Classifier());
  ASSERT_TRUE(subwords.ok()) << subwords.status();
  EXPECT_TRUE(subwords->request.options.subwords);
  b = Request({"a"});
  (*b.mutable_parameters())["subwords"].set_string_param("yes");
  EXPECT_EQ(Error(PlanOf(b, Classifier())), "parameters.subwords: must be a bool");
  b = Request({"a"});
  (*b.mutable_parameters())["priority"].set_uint64_param(3);  // as tritonclient's infer(priority=3) sends it
  absl::StatusOr<InferPlan> low = PlanOf(b, Classifier());
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_EQ(low->request.priority, Priority::kLow);
}

// Every switch of the catalogue is a ModelInfer parameter, derived from the table (a row with a new
// switch needs no list here).
TEST(OipConvertTest, EverySwitchOfTheCatalogueIsAParameter) {
  for (const OutputRow& row : OutputCatalogue()) {
    const char* parameter = NamesOf(row.on).parameter;
    if (parameter == nullptr) continue;
    for (const Manifest& m : {Classifier(), Tagger()}) {
      ModelInferRequest r = Request({"a"});
      (*r.mutable_parameters())[parameter].set_bool_param(true);
      auto plan = PlanOf(r, m);
      ASSERT_TRUE(plan.ok()) << parameter << ": " << plan.status();
    }
  }
}

TEST(OipConvertTest, TheOutputsAskedForDecideWhatIsComputed) {
  ModelInferRequest r = Request({"a"});
  r.add_outputs()->set_name("gates");
  r.add_outputs()->set_name("label");
  auto plan = PlanOf(r, Classifier());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Names(*plan), (std::vector<std::string>{"gates", "label"}));
  EXPECT_TRUE(plan->request.options.Asks(OutputSwitch::kGates));
  EXPECT_FALSE(plan->request.options.Asks(OutputSwitch::kAttention));
  EXPECT_FALSE(plan->request.options.Asks(OutputSwitch::kTokens));

  r = Request({"a"});
  auto* ranked = r.add_outputs();
  ranked->set_name("probabilities");
  (*ranked->mutable_parameters())["classification"].set_int64_param(5);
  plan = PlanOf(r, Classifier());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->outputs[0].classification, 3);  // capped at the labels

  r = Request({"a"});
  r.add_outputs()->set_name("spans");
  EXPECT_EQ(Error(PlanOf(r, Classifier())),
            "outputs[0].name: model 'sentiment' has no output 'spans'; its outputs: label, probabilities, labels, "
            "scores, tokens, token_count, truncated, attention, gates, occlusion, faithfulness_label, "
            "faithfulness_score, faithfulness_score_without, faithfulness_removed, label_set, abstained");
  r = Request({"a"});
  r.add_outputs()->set_name("label");
  r.add_outputs()->set_name("label");
  EXPECT_EQ(Error(PlanOf(r, Classifier())), "outputs[1].name: 'label' is asked for twice");

  ModelInferRequest t = Request({"Ann met Bob"});
  t.set_model_name("ner");
  plan = PlanOf(t, Tagger());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->method, Method::kTag);
  EXPECT_EQ(Names(*plan), (std::vector<std::string>{"spans", "tags", "token_count"}));
  t.add_outputs()->set_name("layer_attention");
  plan = PlanOf(t, Tagger());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->request.options.Asks(OutputSwitch::kLayerAttention));
  EXPECT_FALSE(plan->request.options.Asks(OutputSwitch::kLayerGates));
}

// Reads element i of a raw FP32 / INT32 tensor.
template <typename T>
T At(const std::string& raw, size_t i) {
  T v;
  std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
  return v;
}

std::vector<std::string> Strings(const std::string& raw) {
  std::vector<std::string> out;
  for (size_t at = 0; at < raw.size();) {
    uint32_t n = 0;
    std::memcpy(&n, raw.data() + at, 4);
    out.push_back(raw.substr(at + 4, n));
    at += 4 + n;
  }
  return out;
}

// The per-answer faithfulness check (the native API's options.faithfulness): a parameter, checked
// before the model runs, whose answer comes as four tensors with the default outputs.
TEST(OipConvertTest, TheFaithfulnessCheckIsAParameterAnsweredAsTensors) {
  ModelInferRequest r = Request({"a"});
  (*r.mutable_parameters())["faithfulness_top_k"].set_int64_param(2);
  auto plan = PlanOf(r, Classifier());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->request.options.faithfulness_top_k, 2);
  EXPECT_EQ(Names(*plan),
            (std::vector<std::string>{"label", "probabilities", "faithfulness_label", "faithfulness_score",
                                      "faithfulness_score_without", "faithfulness_removed"}));
  r.add_outputs()->set_name("faithfulness_score_without");
  plan = PlanOf(r, Classifier());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Names(*plan), (std::vector<std::string>{"faithfulness_score_without"}));

  const std::vector<std::pair<std::function<void(inference::InferParameter&)>, std::string>> bad = {
      {[](auto& v) { v.set_bool_param(true); }, "parameters.faithfulness_top_k: must be an int64"},
      {[](auto& v) { v.set_int64_param(33); }, "parameters.faithfulness_top_k: 33 is outside [0, 32]; 0 = no check"},
      {[](auto& v) { v.set_int64_param(-1); }, "parameters.faithfulness_top_k: -1 is outside [0, 32]; 0 = no check"},
  };
  for (const auto& [set, message] : bad) {
    ModelInferRequest b = Request({"a"});
    set((*b.mutable_parameters())["faithfulness_top_k"]);
    EXPECT_EQ(Error(PlanOf(b, Classifier())), message);
  }
  ModelInferRequest t = Request({"a"});
  (*t.mutable_parameters())["faithfulness_top_k"].set_int64_param(1);
  EXPECT_EQ(Error(PlanOf(t, Tagger())),
            "parameters.faithfulness_top_k: the check is for classifiers; model 'ner' tags");
  Manifest plain = Classifier();
  plain.display_name = "CNN";
  plain.outputs = {{"logits", {"B", "C"}}};
  EXPECT_EQ(Error(PlanOf(t, plain)),
            "parameters.faithfulness_top_k: model 'sentiment' (CNN) has no attention to check");
  ModelInferRequest named = Request({"a"});
  named.add_outputs()->set_name("faithfulness_score");
  EXPECT_EQ(Error(PlanOf(named, Classifier())),
            "outputs[0].name: 'faithfulness_score' is the faithfulness check's; ask for the check with "
            "parameters.faithfulness_top_k (1-32)");
  // Without attention the check's tensors are not among the model's outputs at all.
  named = Request({"a"});
  named.add_outputs()->set_name("faithfulness_label");
  EXPECT_NE(Error(PlanOf(named, plain)).find("has no output 'faithfulness_label'"), std::string::npos);

  // The tensors: one row per text, "" and 0 where a text has no check, the indices padded with -1.
  const auto manifest = std::make_shared<const Manifest>(Classifier());
  InferenceResponse answer;
  answer.manifest = manifest;
  answer.results.resize(2);
  answer.results[0].labels = {{"positive", 0.7f}, {"neutral", 0.2f}, {"negative", 0.1f}};
  answer.results[0].faithfulness = FaithfulnessCheckOutput{"positive", 0.7f, 0.25f, {0, 2}};
  answer.results[1].labels = {{"negative", 0.6f}, {"positive", 0.3f}, {"neutral", 0.1f}};
  answer.results[1].faithfulness = FaithfulnessCheckOutput{"negative", 0.6f, 0.5f, {1}};
  InferPlan check;
  check.outputs = {{Output::kFaithfulnessLabel, 0},
                   {Output::kFaithfulnessScore, 0},
                   {Output::kFaithfulnessScoreWithout, 0},
                   {Output::kFaithfulnessRemoved, 0}};
  ModelInferResponse out;
  ToModelInfer(answer, check, "", &out);
  ASSERT_EQ(out.outputs_size(), 4);
  EXPECT_EQ(out.outputs(0).datatype(), "BYTES");
  EXPECT_EQ(Strings(out.raw_output_contents(0)), (std::vector<std::string>{"positive", "negative"}));
  EXPECT_EQ(out.outputs(1).datatype(), "FP32");
  EXPECT_FLOAT_EQ(At<float>(out.raw_output_contents(1), 0), 0.7f);
  EXPECT_FLOAT_EQ(At<float>(out.raw_output_contents(1), 1), 0.6f);
  EXPECT_FLOAT_EQ(At<float>(out.raw_output_contents(2), 0), 0.25f);
  EXPECT_FLOAT_EQ(At<float>(out.raw_output_contents(2), 1), 0.5f);
  EXPECT_EQ(out.outputs(3).datatype(), "INT32");
  EXPECT_EQ(std::vector<int64_t>(out.outputs(3).shape().begin(), out.outputs(3).shape().end()),
            (std::vector<int64_t>{2, 2}));
  const std::string& removed = out.raw_output_contents(3);
  ASSERT_EQ(removed.size(), 4 * sizeof(int32_t));
  EXPECT_EQ(At<int32_t>(removed, 0), 0);
  EXPECT_EQ(At<int32_t>(removed, 1), 2);
  EXPECT_EQ(At<int32_t>(removed, 2), 1);
  EXPECT_EQ(At<int32_t>(removed, 3), -1);
  int64_t raw_bytes = 0;
  for (const std::string& raw : out.raw_output_contents()) raw_bytes += static_cast<int64_t>(raw.size());
  EXPECT_GE(AnswerBytes(answer, check), raw_bytes);

  answer.results[1].faithfulness.reset();  // a text without a check: "" and zeros
  ModelInferResponse partly;
  ToModelInfer(answer, check, "", &partly);
  EXPECT_EQ(Strings(partly.raw_output_contents(0)), (std::vector<std::string>{"positive", ""}));
  EXPECT_FLOAT_EQ(At<float>(partly.raw_output_contents(1), 1), 0.0f);
  EXPECT_EQ(At<int32_t>(partly.raw_output_contents(3), 3), -1);
}

TEST(OipConvertTest, AnswersAreRowMajorPaddedTensorsInTheOrderAsked) {
  const auto manifest = std::make_shared<const Manifest>(Classifier());
  InferenceResponse answer;
  answer.model = "sentiment";
  answer.version = 4;
  answer.manifest = manifest;
  answer.results.resize(2);
  answer.results[0].labels = {{"positive", 0.7f}, {"neutral", 0.2f}, {"negative", 0.1f}};
  answer.results[1].labels = {{"negative", 0.6f}, {"positive", 0.3f}, {"neutral", 0.1f}};
  answer.results[0].num_tokens = 9;  // truncated to max_tokens = 4
  answer.results[0].truncated = true;
  answer.results[1].num_tokens = 2;
  for (int i = 0; i < 4; ++i) {
    TokenOutput t;
    t.token.text = "w" + std::to_string(i);
    t.attention = 0.25f;
    answer.results[0].tokens.push_back(t);
  }
  for (int i = 0; i < 2; ++i) {
    TokenOutput t;
    t.token.text = "v" + std::to_string(i);
    t.attention = 0.5f;
    answer.results[1].tokens.push_back(t);
  }
  ModelInferRequest r = Request({"x", "y"});
  for (const char* n :
       {"probabilities", "label", "scores", "labels", "attention", "tokens", "token_count", "truncated"}) {
    r.add_outputs()->set_name(n);
  }
  (*r.mutable_parameters())["top_k"].set_int64_param(2);
  auto plan = PlanOf(r, *manifest);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ModelInferResponse out;
  ToModelInfer(answer, *plan, "id-1", &out);
  EXPECT_EQ(out.model_name(), "sentiment");
  EXPECT_EQ(out.model_version(), "4");
  EXPECT_EQ(out.id(), "id-1");
  ASSERT_EQ(out.outputs_size(), 8);
  ASSERT_EQ(out.raw_output_contents_size(), 8);
  int64_t raw_bytes = 0;
  for (const std::string& raw : out.raw_output_contents()) raw_bytes += static_cast<int64_t>(raw.size());
  EXPECT_GE(AnswerBytes(answer, *plan), raw_bytes);

  const auto& probabilities = out.outputs(0);
  EXPECT_EQ(probabilities.datatype(), "FP32");
  EXPECT_EQ(std::vector<int64_t>(probabilities.shape().begin(), probabilities.shape().end()),
            (std::vector<int64_t>{2, 3}));
  const std::string& p = out.raw_output_contents(0);
  ASSERT_EQ(p.size(), 6 * sizeof(float));
  // In the manifest's label order (negative, neutral, positive), not best first.
  EXPECT_FLOAT_EQ(At<float>(p, 0), 0.1f);
  EXPECT_FLOAT_EQ(At<float>(p, 1), 0.2f);
  EXPECT_FLOAT_EQ(At<float>(p, 2), 0.7f);
  EXPECT_FLOAT_EQ(At<float>(p, 3), 0.6f);
  EXPECT_FLOAT_EQ(At<float>(p, 5), 0.3f);
  EXPECT_EQ(Strings(out.raw_output_contents(1)), (std::vector<std::string>{"positive", "negative"}));
  EXPECT_EQ(std::vector<int64_t>(out.outputs(2).shape().begin(), out.outputs(2).shape().end()),
            (std::vector<int64_t>{2, 2}));
  EXPECT_FLOAT_EQ(At<float>(out.raw_output_contents(2), 1), 0.2f);
  EXPECT_EQ(Strings(out.raw_output_contents(3)),
            (std::vector<std::string>{"positive", "neutral", "negative", "positive"}));
  const std::string& a = out.raw_output_contents(4);
  EXPECT_EQ(std::vector<int64_t>(out.outputs(4).shape().begin(), out.outputs(4).shape().end()),
            (std::vector<int64_t>{2, 4}));
  EXPECT_FLOAT_EQ(At<float>(a, 3), 0.25f);
  EXPECT_FLOAT_EQ(At<float>(a, 5), 0.5f);
  EXPECT_FLOAT_EQ(At<float>(a, 6), 0.0f);  // padding
  EXPECT_EQ(Strings(out.raw_output_contents(5)),
            (std::vector<std::string>{"w0", "w1", "w2", "w3", "v0", "v1", "", ""}));
  EXPECT_EQ(At<int32_t>(out.raw_output_contents(6), 0), 4);  // tokens read, not the 9 the text had
  EXPECT_EQ(At<int32_t>(out.raw_output_contents(6), 1), 2);
  EXPECT_EQ(out.outputs(7).datatype(), "BOOL");
  EXPECT_EQ(out.raw_output_contents(7), std::string("\x01\x00", 2));

  InferPlan classes;
  classes.outputs = {{Output::kProbabilities, 2}};
  ModelInferResponse c;
  ToModelInfer(answer, classes, "", &c);
  EXPECT_EQ(c.outputs(0).datatype(), "BYTES");
  EXPECT_EQ(Strings(c.raw_output_contents(0)),
            (std::vector<std::string>{"0.7:2:positive", "0.2:1:neutral", "0.6:0:negative", "0.3:2:positive"}));
}

TEST(OipConvertTest, LayerMapsArePaddedToTheLongestTextAndSizedBeforeTheyAreBuilt) {
  const auto manifest = std::make_shared<const Manifest>(Tagger());
  InferenceResponse answer;
  answer.model = "ner";
  answer.version = 1;
  answer.manifest = manifest;
  answer.results.resize(2);
  for (int text = 0; text < 2; ++text) {
    const int t = text == 0 ? 3 : 1;
    for (int i = 0; i < t; ++i) answer.results[text].tokens.push_back(TokenOutput{});
    LayerMapOutput map;
    map.layer = 1;
    map.head = -1;
    for (int i = 0; i < t * t; ++i) map.attention.push_back(static_cast<float>(text * 100 + i));
    answer.results[text].layers.push_back(map);
    SpanOutput span;
    span.label = "PER";
    span.text = "Ann \"A\"";
    answer.results[text].spans.push_back(span);
  }
  InferPlan plan;
  plan.outputs = {{Output::kLayerIndex, 0}, {Output::kLayerAttention, 0}, {Output::kSpans, 0}};
  ModelInferResponse out;
  ToModelInfer(answer, plan, "", &out);
  EXPECT_EQ(At<int32_t>(out.raw_output_contents(0), 0), 1);
  EXPECT_EQ(At<int32_t>(out.raw_output_contents(0), 1), -1);
  EXPECT_EQ(std::vector<int64_t>(out.outputs(1).shape().begin(), out.outputs(1).shape().end()),
            (std::vector<int64_t>{2, 1, 3, 3}));
  const std::string& maps = out.raw_output_contents(1);
  EXPECT_FLOAT_EQ(At<float>(maps, 5), 5.0f);    // text 0, row 1, column 2
  EXPECT_FLOAT_EQ(At<float>(maps, 9), 100.0f);  // text 1, its one cell
  EXPECT_FLOAT_EQ(At<float>(maps, 10), 0.0f);   // then padding
  EXPECT_EQ(
      Strings(out.raw_output_contents(2))[0],
      R"([{"byte_end":0,"byte_start":0,"end":0,"label":"PER","score":0.0,"start":0,"text":"Ann \"A\"","token_end":0,"token_start":0}])");
  int64_t raw_bytes = 0;
  for (const std::string& raw : out.raw_output_contents()) raw_bytes += static_cast<int64_t>(raw.size());
  EXPECT_GE(AnswerBytes(answer, plan), raw_bytes);
  // One long text among many short ones: the padded maps grow with the longest text squared,
  // and the size is known before anything is allocated.
  answer.results.resize(256, answer.results[1]);
  for (int i = 0; i < 500; ++i) answer.results[0].tokens.push_back(TokenOutput{});
  EXPECT_GT(AnswerBytes(answer, plan), int64_t{256} * 503 * 503 * 4);
}

TEST(OipConvertTest, TheSizeBeforeTheModelRunsBoundsTheAnswer) {
  // A tagger's answer with every token a span, the longest tag on each, and one map per layer and
  // head: what AnswerBytesBefore sees of it is its tokens alone.
  const auto manifest = std::make_shared<const Manifest>(Tagger());
  InferenceRequest request;
  request.texts = {"Ann met Bob in Rome", "Zed"};
  request.options.Ask(OutputSwitch::kLayerAttention);
  request.options.layers.layers = {0, 1};
  request.options.layers.heads = {0};
  InferenceResponse tokenised;
  tokenised.model = "ner";
  tokenised.manifest = manifest;
  for (const std::string& text : request.texts) {
    TextResult r;
    size_t at = 0;
    while (at < text.size()) {
      const size_t end = std::min(text.find(' ', at), text.size());
      TokenOutput t;
      t.token.text = text.substr(at, end - at);
      t.token.byte_start = static_cast<uint32_t>(at);
      t.token.byte_end = static_cast<uint32_t>(end);
      r.tokens.push_back(t);
      at = end + 1;
    }
    tokenised.results.push_back(r);
  }
  InferenceResponse answer = tokenised;
  for (TextResult& r : answer.results) {
    const size_t t = r.tokens.size();
    for (TokenOutput& token : r.tokens) {
      token.tag = "B-PER";
      r.spans.push_back(
          SpanOutput{"PER", 0, 0, token.token.byte_start, token.token.byte_end, 0, 1, token.token.text, 0.5f});
    }
    for (int layer = 0; layer < 2; ++layer) {
      LayerMapOutput map;
      map.layer = layer;
      map.attention.assign(t * t, 0.5f);
      r.layers.push_back(map);
    }
  }
  InferPlan plan;
  plan.outputs = {{Output::kSpans, 0},
                  {Output::kTags, 0},
                  {Output::kTokens, 0},
                  {Output::kLayerAttention, 0},
                  {Output::kLayerIndex, 0}};
  ModelInferResponse out;
  ToModelInfer(answer, plan, "", &out);
  int64_t raw_bytes = 0;
  for (const std::string& raw : out.raw_output_contents()) raw_bytes += static_cast<int64_t>(raw.size());
  EXPECT_GE(AnswerBytesBefore(request, tokenised, plan), raw_bytes);
  EXPECT_GE(AnswerBytesBefore(request, tokenised, plan), AnswerBytes(answer, plan));
}

TEST(OipConvertTest, VersionsAreEmptyOrPositiveIntegers) {
  EXPECT_EQ(*ParseVersion("version", ""), 0);
  EXPECT_EQ(*ParseVersion("version", "12"), 12);
  for (const char* bad : {"0", "-1", "1.0", " 1", "1a", "9999999999999999999"}) {
    EXPECT_FALSE(ParseVersion("version", bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace qvi::oip

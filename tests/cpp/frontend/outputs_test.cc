// The output catalogue (server/core/outputs/outputs.h): its rows agree with the enum, the manifest's
// names, the native API's fields and the OIP tensors, so that a new output is one row.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "client/output_names.h"
#include "qvi/serving/v1/inference.pb.h"
#include "server/core/outputs/answer_tensors.h"
#include "server/core/outputs/outputs.h"
#include "server/core/request/request.h"
#include "server/frontend/native/api.h"

namespace qvi {
namespace {

TEST(OutputCatalogueTest, RowsFollowTheEnumAndNamesAreUnique) {
  const std::vector<OutputRow>& rows = OutputCatalogue();
  ASSERT_EQ(rows.size(), kOutputCount);
  std::set<std::string> names;
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(rows[i].id), i);
    EXPECT_TRUE(names.insert(rows[i].name).second) << rows[i].name;
    EXPECT_EQ(OutputNamed(rows[i].name), rows[i].id);
    // Every row is on the wire, in the model, or both.
    EXPECT_TRUE(rows[i].model_shape != nullptr || rows[i].wire_datatype != nullptr) << rows[i].name;
    EXPECT_EQ(rows[i].wire_datatype != nullptr, rows[i].write != nullptr && rows[i].bytes != nullptr)
        << rows[i].name << ": a wire tensor needs its writer and size";
  }
  EXPECT_FALSE(OutputNamed("layer_lambda"));
  EXPECT_FALSE(OutputNamed(""));
}

TEST(OutputCatalogueTest, EveryAnswerFieldHasItsNativeApiField) {
  const std::vector<Output> bound = OutputsWithProtoFields();
  for (const OutputRow& row : OutputCatalogue()) {
    const bool has_field = row.token_field != nullptr || row.layer_field != nullptr || row.label_token_field != nullptr;
    EXPECT_EQ(has_field, row.proto_field != nullptr) << row.name;
    if (!has_field) continue;
    const google::protobuf::Descriptor* message =
        row.layer_field == nullptr ? serving::v1::Token::descriptor() : serving::v1::LayerMap::descriptor();
    EXPECT_NE(message->FindFieldByName(row.proto_field), nullptr) << row.name << " -> " << row.proto_field;
    EXPECT_NE(std::find(bound.begin(), bound.end(), row.id), bound.end())
        << row.name << " has an answer field but server/frontend/native/api.cc does not copy it into the native API";
  }
}

// A row that a request option turns on has that option's names (NamesOf), and its parameter name
// leads back to its switch: the native API, OIP and the null model all read the switches from here.
TEST(OutputCatalogueTest, EveryRequestSwitchARowUsesHasItsNames) {
  // kFaithfulness is asked by a number, not a switch: options.faithfulness.top_k, OIP's int64
  // parameter faithfulness_top_k (server/frontend/oip/request.cc reads it); kCoverage and kAbstention
  // by a probability (options.coverage, options.abstain_below; OIP's double parameters of those names).
  const std::set<OutputSwitch> not_asked = {
      OutputSwitch::kAnswer,       OutputSwitch::kNamed,    OutputSwitch::kAnyToken,  OutputSwitch::kAnyLayer,
      OutputSwitch::kFaithfulness, OutputSwitch::kCoverage, OutputSwitch::kAbstention};
  for (const OutputRow& row : OutputCatalogue()) {
    if (not_asked.count(row.on) > 0) {
      EXPECT_EQ(NamesOf(row.on).parameter, nullptr) << row.name;
      continue;
    }
    const SwitchNames names = NamesOf(row.on);
    ASSERT_NE(names.parameter, nullptr) << row.name << ": its switch has no parameter name (NamesOf)";
    ASSERT_NE(names.option, nullptr) << row.name << ": its switch has no option name (NamesOf)";
    EXPECT_EQ(SwitchParameter(names.parameter), row.on) << row.name;
  }
  EXPECT_FALSE(SwitchParameter("nope"));
}

TEST(OutputCatalogueTest, SwitchesTurnOnTheirOutputsAndNothingElse) {
  OutputOptions o;
  EXPECT_FALSE(o.AsksPerToken());
  o.Ask(OutputSwitch::kAttention);
  EXPECT_TRUE(o.Asks(Output::kAttention));
  EXPECT_TRUE(o.Asks(Output::kSentenceAttention));
  EXPECT_FALSE(o.Asks(Output::kGates));
  EXPECT_TRUE(o.AsksPerToken());
  EXPECT_FALSE(o.AsksLayers());
  o.Ask(OutputSwitch::kLayerGates);
  EXPECT_TRUE(o.AsksLayers());
  EXPECT_EQ(SwitchedBy(OutputSwitch::kGates),
            OutputsOf({Output::kGates, Output::kSentenceGates, Output::kLambdaQ, Output::kLambdaK}));
  for (OutputSwitch on : {OutputSwitch::kTokens, OutputSwitch::kAttention, OutputSwitch::kGates,
                          OutputSwitch::kLayerGates, OutputSwitch::kLayerAttention, OutputSwitch::kContributions}) {
    EXPECT_EQ(SwitchParameter(NamesOf(on).parameter), on);
    EXPECT_NE(std::string(NamesOf(on).option).find("options."), std::string::npos);
  }
  EXPECT_FALSE(SwitchParameter("top_k"));
  EXPECT_EQ(AnswerTensors(Task::kClassification), OutputsOf({Output::kLogits}));
  EXPECT_EQ(AnswerTensors(Task::kTagging), OutputsOf({Output::kEmissions, Output::kTags}));
}

TEST(OutputCatalogueTest, WireOutputsAndDefaultsFollowTheModelAndTheSwitches) {
  Manifest m;
  m.name = "han";
  m.task = Task::kClassification;
  m.labels = {"a", "b", "c"};
  m.outputs = {{"logits", {"B", "C"}},         {"attention", {"B", "T"}},
               {"gates", {"B", "T"}},          {"sentence_attention", {"B", "T"}},
               {"sentence_gates", {"B", "T"}}, {"unknown", {"B"}}};
  std::vector<std::string> names;
  for (const TensorSpec& s : WireOutputs(m)) names.push_back(s.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"label", "probabilities", "labels", "scores", "tokens", "token_count",
                                      "truncated", "attention", "sentence_attention", "gates", "sentence_gates",
                                      "occlusion", "faithfulness_label", "faithfulness_score",
                                      "faithfulness_score_without", "faithfulness_removed", "label_set", "abstained"}));
  EXPECT_EQ(WireOutputs(m)[1].shape, (std::vector<int64_t>{-1, 3}));
  EXPECT_EQ(OutputsOfModel(m), OutputsOf({Output::kLogits, Output::kAttention, Output::kGates,
                                          Output::kSentenceAttention, Output::kSentenceGates}));
  OutputOptions o;
  EXPECT_EQ(DefaultWireOutputs(m, o.outputs), (std::vector<Output>{Output::kLabel, Output::kProbabilities}));
  o.Ask(OutputSwitch::kGates);
  EXPECT_EQ(DefaultWireOutputs(m, o.outputs),
            (std::vector<Output>{Output::kLabel, Output::kProbabilities, Output::kTokenCount, Output::kGates,
                                 Output::kSentenceGates}));
  // The check's tensors: only where the model has α, and in a default answer only when asked.
  EXPECT_TRUE(HasWireOutput(m, Output::kFaithfulnessRemoved));
  EXPECT_EQ(DefaultWireOutputs(m, SwitchedBy(OutputSwitch::kFaithfulness)),
            (std::vector<Output>{Output::kLabel, Output::kProbabilities, Output::kFaithfulnessLabel,
                                 Output::kFaithfulnessScore, Output::kFaithfulnessScoreWithout,
                                 Output::kFaithfulnessRemoved}));
  // The label set and the abstention flag: in a default answer when their parameters were given.
  EXPECT_EQ(DefaultWireOutputs(m, SwitchedBy(OutputSwitch::kCoverage) | SwitchedBy(OutputSwitch::kAbstention)),
            (std::vector<Output>{Output::kLabel, Output::kProbabilities, Output::kLabelSet, Output::kAbstained}));
  m.outputs = {{"logits", {"B", "C"}}};
  EXPECT_FALSE(HasWireOutput(m, Output::kFaithfulnessLabel));
  // Contributions: a model with them has the per-label tensors (HAN also its sentences'), a default
  // answer carries them when asked, with token_count; a tagger never has them.
  m.outputs = {{"logits", {"B", "C"}}, {"attention", {"B", "T"}}, {"contribution", {"B", "T", "C"}}};
  EXPECT_TRUE(HasWireOutput(m, Output::kContribution));
  EXPECT_TRUE(HasWireOutput(m, Output::kMargin));
  EXPECT_FALSE(HasWireOutput(m, Output::kSentenceContribution));
  EXPECT_EQ(DefaultWireOutputs(m, SwitchedBy(OutputSwitch::kContributions)),
            (std::vector<Output>{Output::kLabel, Output::kProbabilities, Output::kTokenCount, Output::kContribution,
                                 Output::kMargin, Output::kContributionRest}));
  EXPECT_EQ(OutputsOfModel(m), OutputsOf({Output::kLogits, Output::kAttention, Output::kContribution}));
  OutputOptions contributions;
  contributions.Ask(OutputSwitch::kContributions);
  EXPECT_TRUE(contributions.AsksPerToken());
  m.task = Task::kTagging;
  EXPECT_FALSE(HasWireOutput(m, Output::kContribution));
  // Occlusion needs no model output: every classifier has `occlusion`, every tagger `entity_occlusion`
  // (a tagger without a CRF scores its entities by its tags' softmax), in a default answer only when asked.
  EXPECT_TRUE(HasWireOutput(m, Output::kEntityOcclusion));
  EXPECT_FALSE(HasWireOutput(m, Output::kOcclusion));
  EXPECT_EQ(DefaultWireOutputs(m, SwitchedBy(OutputSwitch::kOcclusion)),
            (std::vector<Output>{Output::kSpans, Output::kTags, Output::kTokenCount, Output::kEntityOcclusion}));
  m.task = Task::kClassification;
  EXPECT_EQ(DefaultWireOutputs(m, SwitchedBy(OutputSwitch::kOcclusion)),
            (std::vector<Output>{Output::kLabel, Output::kProbabilities, Output::kTokenCount, Output::kOcclusion}));
  OutputOptions occlusion;
  occlusion.Ask(OutputSwitch::kOcclusion);
  EXPECT_TRUE(occlusion.AsksPerToken());
  // word_index: only a sub-word model's (format 2), whose answers with tokens carry it.
  EXPECT_FALSE(HasWireOutput(m, Output::kWordIndex));
  m.tokenizer.level = TokenLevel::kSubword;
  EXPECT_TRUE(HasWireOutput(m, Output::kWordIndex));
  EXPECT_EQ(DefaultWireOutputs(m, SwitchedBy(OutputSwitch::kTokens)),
            (std::vector<Output>{Output::kLabel, Output::kProbabilities, Output::kTokens, Output::kTokenCount,
                                 Output::kWordIndex}));
}

// qvi-client's lists of the outputs each option turns on (client/output_names.h): the client does not
// link the server, so a row added to a switch without the client's list fails here.
TEST(OutputCatalogueTest, TheClientsOptionListsAreTheCatalogues) {
  auto names = [](OutputSwitch on) {
    std::set<std::string> out;
    for (Output o : InOrder(SwitchedBy(on))) out.insert(OutputName(o));
    return out;
  };
  auto set_of = [](const std::vector<std::string_view>& list) {
    return std::set<std::string>(list.begin(), list.end());
  };
  EXPECT_EQ(set_of(client::kAttentionOutputs), names(OutputSwitch::kAttention));
  EXPECT_EQ(set_of(client::kGateOutputs), names(OutputSwitch::kGates));
  EXPECT_EQ(set_of(client::kLayerGateOutputs), names(OutputSwitch::kLayerGates));
  EXPECT_EQ(set_of(client::kLayerAttentionOutputs), names(OutputSwitch::kLayerAttention));
  EXPECT_EQ(set_of(client::kContributionOutputs), names(OutputSwitch::kContributions));
}

}  // namespace
}  // namespace qvi

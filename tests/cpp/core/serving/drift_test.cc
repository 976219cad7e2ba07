// Drift gauges (server/core/serving/drift.h): the population stability index's arithmetic, and the monitor's
// window against a hand-made reference — what an answer contributes (labels, lengths, unknown tokens, scores
// at the reference's temperature only), the window's eviction, a label the reference never saw, a tagger's
// entities, a version whose files changed — with the readings its observer is told.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/core/serving/drift.h"

namespace qvi {
namespace {

TEST(PopulationStabilityTest, IsZeroOnTheReferenceAndSumsEachBinsTerm) {
  EXPECT_NEAR(PopulationStability({25, 50, 25}, 100, {0.25, 0.5, 0.25}), 0, 1e-12);
  const double expected = (0.5 - 0.25) * std::log(0.5 / 0.25) + (0.5 - 0.75) * std::log(0.5 / 0.75);
  EXPECT_NEAR(PopulationStability({5, 5}, 10, {0.25, 0.75}), expected, 1e-12);
  // An empty bin on either side is floored at 1e-4, not infinite; a bin past the reference's end is one it
  // never saw.
  EXPECT_NEAR(PopulationStability({0, 10}, 10, {0.5, 0.5}),
              (1e-4 - 0.5) * std::log(1e-4 / 0.5) + (1 - 0.5) * std::log(1 / 0.5), 1e-12);
  EXPECT_NEAR(PopulationStability({5, 5}, 10, {1.0}), (0.5 - 1) * std::log(0.5) + (0.5 - 1e-4) * std::log(0.5 / 1e-4),
              1e-12);
}

std::shared_ptr<const Manifest> Classifier(std::optional<double> calibrated, double reference_temperature) {
  auto m = std::make_shared<Manifest>();
  m->name = "m";
  m->labels = {"neg", "pos"};
  m->tokenizer.max_tokens = 20;
  if (calibrated) m->calibration.emplace().temperature = *calibrated;
  DriftReference& r = m->drift_reference.emplace();
  r.labels = {{"neg", 0.5}, {"pos", 0.5}};
  r.length = {{5, 10}, {0.3, 0.4, 0.3}};
  r.confidence = {{0.7, 0.9}, {0.2, 0.3, 0.5}};
  r.temperature = reference_temperature;
  r.unknown = 0.02;
  r.below_threshold = 0.9;
  r.below_share = 0.5;
  return m;
}

TextResult Text(const std::string& label, float score, uint32_t tokens, uint32_t unknown) {
  TextResult t;
  t.labels = {{label, score}, {label == "pos" ? "neg" : "pos", 1 - score}};
  t.num_tokens = tokens;
  t.vocab_units = std::min<uint32_t>(tokens, 20);
  t.vocab_unknown = unknown;
  return t;
}

InferenceResponse Answer(std::shared_ptr<const Manifest> m, std::vector<TextResult> results) {
  InferenceResponse a;
  a.model = "m";
  a.version = 1;
  a.manifest = std::move(m);
  a.results = std::move(results);
  return a;
}

struct Readings : ServingObserver {
  void OnBatch(const std::string&, int64_t, const BatchReport&) override {}
  void OnQueueDepth(const std::string&, int64_t, size_t) override {}
  void OnDrift(const std::string& model, int64_t version, const DriftReading& r) override {
    seen.emplace_back(model + "@" + std::to_string(version), r);
  }
  std::vector<std::pair<std::string, DriftReading>> seen;
};

void Observe(DriftMonitor& monitor, const InferenceResponse& a, bool raw = false) {
  monitor.Observe(a.model, a.version, a.manifest, DriftMonitor::Read(a, raw));
}

TEST(DriftMonitorTest, ComparesTheWindowWithTheReference) {
  Readings observer;
  DriftMonitor monitor(4, &observer);
  const auto m = Classifier(2.0, 2.0);
  // Lengths 3 (bin 0), 7 (bin 1), 25 read as 20 (max_tokens: bin 2), 12 (bin 2); scores 0.95, 0.8, 0.6, 0.95.
  Observe(monitor, Answer(m, {Text("pos", 0.95f, 3, 0), Text("pos", 0.8f, 7, 1), Text("neg", 0.6f, 25, 2)}));
  Observe(monitor, Answer(m, {Text("pos", 0.95f, 12, 1)}));
  ASSERT_EQ(observer.seen.size(), 2u);
  const DriftReading r = *monitor.Reading("m", 1);
  EXPECT_EQ(observer.seen.back().first, "m@1");
  EXPECT_EQ(observer.seen.back().second.label_psi, r.label_psi);
  EXPECT_EQ(r.texts, 4);
  EXPECT_EQ(r.answers, 4);
  EXPECT_NEAR(r.label_psi, PopulationStability({1, 3, 0}, 4, {0.5, 0.5}), 1e-12);
  EXPECT_NEAR(r.length_psi, PopulationStability({1, 1, 2}, 4, {0.3, 0.4, 0.3}), 1e-12);
  EXPECT_NEAR(r.confidence_psi, PopulationStability({1, 1, 2}, 4, {0.2, 0.3, 0.5}), 1e-12);
  EXPECT_NEAR(r.unknown, 4.0 / (3 + 7 + 20 + 12), 1e-12);
  EXPECT_DOUBLE_EQ(r.unknown_reference, 0.02);
  EXPECT_DOUBLE_EQ(r.below, 0.5);  // 0.8 and 0.6 below 0.9
  EXPECT_DOUBLE_EQ(r.below_reference, 0.5);
  EXPECT_DOUBLE_EQ(r.below_threshold, 0.9);

  // The window keeps the last four texts: two more push out the first two.
  Observe(monitor, Answer(m, {Text("neg", 0.99f, 8, 0), Text("neg", 0.99f, 8, 0)}));
  const DriftReading later = *monitor.Reading("m", 1);
  EXPECT_EQ(later.texts, 4);
  EXPECT_NEAR(later.label_psi, PopulationStability({3, 1, 0}, 4, {0.5, 0.5}), 1e-12);
  EXPECT_NEAR(later.unknown, 3.0 / (20 + 12 + 8 + 8), 1e-12);
  EXPECT_DOUBLE_EQ(later.below, 0.25);
  EXPECT_FALSE(monitor.Reading("m", 2));
}

TEST(DriftMonitorTest, ScoresAtAnotherTemperatureCountForTheLabelsAlone) {
  DriftMonitor monitor(100, nullptr);
  // The card's calibration at 2, the reference measured at 2: a request with raw_scores answers at 1.
  const auto m = Classifier(2.0, 2.0);
  Observe(monitor, Answer(m, {Text("pos", 0.95f, 3, 0)}), /*raw=*/true);
  DriftReading r = *monitor.Reading("m", 1);
  EXPECT_EQ(r.texts, 1);
  EXPECT_EQ(r.answers, 0);
  EXPECT_EQ(r.confidence_psi, 0);
  EXPECT_GT(r.label_psi, 0);
  // A reference measured at 1 while the card now calibrates at 2: only raw answers are comparable.
  const auto stale = Classifier(2.0, 1.0);
  DriftMonitor other(100, nullptr);
  Observe(other, Answer(stale, {Text("pos", 0.95f, 3, 0)}), /*raw=*/false);
  EXPECT_EQ(other.Reading("m", 1)->answers, 0);
  Observe(other, Answer(stale, {Text("pos", 0.95f, 3, 0)}), /*raw=*/true);
  EXPECT_EQ(other.Reading("m", 1)->answers, 1);
}

TEST(DriftMonitorTest, ALabelTheReferenceNeverSawHasABinOfItsOwn) {
  DriftMonitor monitor(100, nullptr);
  Observe(monitor, Answer(Classifier(std::nullopt, 1.0), {Text("maybe", 0.95f, 3, 0), Text("pos", 0.95f, 3, 0)}));
  EXPECT_NEAR(monitor.Reading("m", 1)->label_psi, PopulationStability({0, 1, 1}, 2, {0.5, 0.5}), 1e-12);
}

TEST(DriftMonitorTest, ATaggersEntitiesAreItsAnswers) {
  auto m = std::const_pointer_cast<Manifest>(Classifier(std::nullopt, 1.0));
  m->task = Task::kTagging;
  m->drift_reference->labels = {{"LOC", 0.5}, {"PER", 0.5}};
  TextResult t;
  t.num_tokens = 6;
  SpanOutput per, loc;
  per.label = "PER";
  per.score = 0.95f;
  loc.label = "LOC";
  loc.score = 0.5f;
  t.spans = {per, per, loc};
  TextResult none;  // a text with no entity: a length, no answer
  none.num_tokens = 2;
  DriftMonitor monitor(100, nullptr);
  Observe(monitor, Answer(m, {t, none}));
  const DriftReading r = *monitor.Reading("m", 1);
  EXPECT_EQ(r.texts, 2);
  EXPECT_EQ(r.answers, 3);
  EXPECT_NEAR(r.label_psi, PopulationStability({1, 2, 0}, 3, {0.5, 0.5}), 1e-12);
  EXPECT_NEAR(r.below, 1.0 / 3, 1e-12);
}

TEST(DriftMonitorTest, AVersionWithoutAReferenceOrWithNewFilesStartsNoneOrAfresh) {
  auto plain = std::make_shared<Manifest>();
  plain->labels = {"neg", "pos"};
  EXPECT_TRUE(DriftMonitor::Read(Answer(plain, {Text("pos", 0.9f, 3, 0)}), false).empty());
  DriftMonitor monitor(100, nullptr);
  Observe(monitor, Answer(Classifier(std::nullopt, 1.0), {Text("pos", 0.9f, 3, 0), Text("pos", 0.9f, 3, 0)}));
  EXPECT_EQ(monitor.Reading("m", 1)->texts, 2);
  // The same version, its files replaced in place: another manifest, a new window.
  Observe(monitor, Answer(Classifier(std::nullopt, 1.0), {Text("pos", 0.9f, 3, 0)}));
  EXPECT_EQ(monitor.Reading("m", 1)->texts, 1);
}

}  // namespace
}  // namespace qvi

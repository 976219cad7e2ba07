// The Model interface: what Forward() does around any backend (on the fake), which artifact Load()
// picks, and the parity of the two backends on the demo models (TorchScript against AOTInductor:
// every output, and the tags the server's Viterbi decodes against the model's own).
#include "server/core/model/model.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/core/model/viterbi.h"
#include "tests/cpp/test_util/fake_model.h"
#include "tests/cpp/test_util/run.h"

namespace qvi {
namespace {

namespace fs = std::filesystem;

std::pair<at::Tensor, at::Tensor> Batch(const std::vector<std::vector<int64_t>>& rows) {
  int64_t width = 1;
  for (const auto& r : rows) width = std::max<int64_t>(width, static_cast<int64_t>(r.size()));
  at::Tensor ids = torch::zeros({static_cast<int64_t>(rows.size()), width}, torch::kLong);
  at::Tensor mask = torch::zeros_like(ids, torch::kBool);
  for (size_t b = 0; b < rows.size(); ++b) {
    for (size_t t = 0; t < rows[b].size(); ++t) {
      ids[b][t] = rows[b][t];
      mask[b][t] = true;
    }
  }
  return {ids, mask};
}

TEST(ModelForwardTest, ReturnsOnlyWhatIsAskedAndSkipsTheMapsWhenNobodyWantsThem) {
  std::unique_ptr<FakeModel> model = FakeModel::Create();
  auto [ids, mask] = Batch({{2, 3, 4}, {4}});
  absl::StatusOr<ModelOutputs> out = model->Forward(ids, mask, testing::Named({"logits", "gates"}));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->present().count(), 2u);
  EXPECT_TRUE(torch::equal(out->at(Output::kLogits), torch::tensor({{9.0f, 3.0f}, {4.0f, 1.0f}})));
  EXPECT_EQ(model->runs_with_maps(), 0);
  EXPECT_EQ(model->runs_without_maps(), 1);
  out = model->Forward(ids, mask, testing::Named({"layer_attention"}));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(model->runs_with_maps(), 1);
  EXPECT_EQ(out->at(Output::kLayerAttention).sizes(), (std::vector<int64_t>{2, 2, 3, 3, 3}));
}

TEST(ModelForwardTest, CopiesOnlyTheSelectedLayersAndHeadsAndNamesThem) {
  std::unique_ptr<FakeModel> model = FakeModel::Create();
  auto [ids, mask] = Batch({{2, 3}});
  OutputSelection selection{{1}, {0, 2}, false};
  absl::StatusOr<ModelOutputs> out = model->Forward(ids, mask, testing::Named({"layer_gates"}), selection);
  ASSERT_TRUE(out.ok()) << out.status();
  // layer_gates = layer + head/10 on real tokens: layer 1, heads 0 and 2.
  EXPECT_TRUE(torch::allclose(out->at(Output::kLayerGates),
                              torch::tensor({1.0f, 1.2f}).view({1, 1, 2, 1}).expand({1, 1, 2, 2})));
  EXPECT_TRUE(torch::equal(out->layer_index, torch::tensor({1}, torch::kLong)));
  EXPECT_TRUE(torch::equal(out->head_index, torch::tensor({0, 2}, torch::kLong)));
  selection.mean_heads = true;
  out = model->Forward(ids, mask, testing::Named({"layer_gates"}), selection);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(torch::allclose(out->at(Output::kLayerGates), torch::full({1, 1, 1, 2}, 1.1f)));
  EXPECT_TRUE(torch::equal(out->head_index, torch::tensor({-1}, torch::kLong)));
}

TEST(ModelForwardTest, OutputsThatContradictTheManifestAreAnInternalError) {
  std::unique_ptr<FakeModel> model = FakeModel::Create("fake", 16, /*bad_from_batch=*/3);
  auto [ids, mask] = Batch({{2}, {3}, {4}});
  absl::StatusOr<ModelOutputs> out = model->Forward(ids, mask, testing::Named({"logits"}));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(out.status().message().find("returned logits of shape [3,1]"), std::string::npos) << out.status();
  auto [two, two_mask] = Batch({{2}, {3}});
  EXPECT_TRUE(model->Forward(two, two_mask, testing::Named({"logits"})).ok());
}

TEST(ViterbiTest, FindsTheBestPathAndMarksPadding) {
  // Two tags, the transition 0 -> 1 all but forbidden (-100).
  CrfScores crf{{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, -100.0f, 0.0f, 0.0f}};
  // Row 0: 1,0,0 scores 5+3+3 = 11, the best. Row 1 (two real tokens) prefers 0 then 1, which
  // needs 0 -> 1.
  at::Tensor e =
      torch::tensor({{{0.0f, 5.0f}, {3.0f, 0.0f}, {3.0f, 0.0f}}, {{2.0f, 0.0f}, {0.0f, 3.0f}, {9.0f, 9.0f}}});
  at::Tensor mask = torch::tensor({{true, true, true}, {true, true, false}});
  absl::StatusOr<at::Tensor> tags = ViterbiDecode(crf, e, mask);
  ASSERT_TRUE(tags.ok()) << tags.status();
  // Row 1: 0,0 scores 2+0 = 2; 1,1 scores 0+3 = 3; 1,0 scores 0+0 = 0; 0,1 is forbidden.
  EXPECT_TRUE(torch::equal(*tags, torch::tensor({{1, 0, 0}, {1, 1, -1}}, torch::kLong))) << *tags;
  EXPECT_FALSE(ViterbiDecode(crf, torch::zeros({1, 3, 3}), torch::ones({1, 3}, torch::kBool)).ok());
}

TEST(CrfMarginalsTest, EqualTheMarginalsOfEveryPathEnumerated) {
  // Three tags, four tokens, scores drawn from a seeded generator: p(y_t = k) by summing exp(score)
  // over all 3^4 paths, against the forward-backward. The emissions are read through strides (a
  // transposed layout), as a batch row of a [B,T,K] tensor may be.
  torch::manual_seed(5);
  const int k = 3, n = 4;
  const at::Tensor start = torch::randn({k}), end = torch::randn({k}), trans = torch::randn({k, k});
  const at::Tensor emissions = torch::randn({k, n}) * 2;  // [K, T]: token stride 1, tag stride n
  CrfScores crf{std::vector<float>(start.data_ptr<float>(), start.data_ptr<float>() + k),
                std::vector<float>(end.data_ptr<float>(), end.data_ptr<float>() + k),
                std::vector<float>(trans.data_ptr<float>(), trans.data_ptr<float>() + k * k)};
  const std::vector<float> got = CrfMarginals(crf, emissions.data_ptr<float>(), n, 1, n);
  ASSERT_EQ(got.size(), static_cast<size_t>(n * k));
  std::vector<double> want(n * k, 0.0);
  double z = 0;
  for (int path = 0; path < 81; ++path) {
    int y[n];
    for (int t = 0, rest = path; t < n; ++t, rest /= k) y[t] = rest % k;
    double score = start[y[0]].item<float>() + end[y[n - 1]].item<float>();
    for (int t = 0; t < n; ++t) score += emissions[y[t]][t].item<float>();
    for (int t = 1; t < n; ++t) score += trans[y[t - 1]][y[t]].item<float>();
    const double w = std::exp(score);
    z += w;
    for (int t = 0; t < n; ++t) want[t * k + y[t]] += w;
  }
  for (int t = 0; t < n; ++t) {
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      EXPECT_NEAR(got[t * k + j], want[t * k + j] / z, 1e-6) << "token " << t << " tag " << j;
      sum += got[t * k + j];
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << "token " << t;
  }
  EXPECT_TRUE(CrfMarginals(crf, emissions.data_ptr<float>(), 0, 1, n).empty());
}

// --- Load(): which file of a version folder --------------------------------------------------

class ModelLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    demo_ = fs::path(QVI_SOURCE_DIR) / "model_store" / "store";
    ASSERT_TRUE(fs::exists(demo_ / "sentiment" / "1" / "model.pt")) << "run scripts/setup.sh first";
    ASSERT_TRUE(fs::exists(demo_ / "sentiment" / "1" / "model.cpu.pt2"))
        << "run scripts/setup.sh first (it compiles the demo packages)";
    dir_ = fs::path(::testing::TempDir()) / ("model_load_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& format, int instances = 1,
                                              const std::string& cpu_package = "auto") {
    LoadOptions o;
    o.device = "cpu";
    o.format = *ParseModelFormat(format);
    o.instances = instances;
    o.cpu_package = cpu_package;
    return Model::Load(dir_.string(), o);
  }

  fs::path demo_, dir_;
};

TEST_F(ModelLoadTest, AutoPrefersThePackageAndEitherFormatCanBeForced) {
  fs::copy_file(demo_ / "sentiment" / "1" / "model.pt", dir_ / "model.pt");
  fs::copy_file(demo_ / "sentiment" / "1" / "model.cpu.pt2", dir_ / "model.cpu.pt2");
  absl::StatusOr<std::unique_ptr<Model>> m = Load("auto");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->format(), "pt2");
  EXPECT_TRUE((*m)->has_forward_without_maps());
  EXPECT_EQ((*m)->fallback_reason(), "");
  // The demo's exporter timed the package with and without frozen weights (pt2.json's "freezing",
  // "freezing_choice"); the log line says which it kept.
  const std::string note = (*m)->compile_note();
  EXPECT_TRUE(note == "frozen weights (the faster on the compiling CPU)" ||
              note == "weights not frozen (the faster on the compiling CPU)")
      << note;
  m = Load("torchscript");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->format(), "torchscript");
  EXPECT_EQ((*m)->compile_note(), "");
  fs::remove(dir_ / "model.cpu.pt2");
  m = Load("pt2");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model.cpu.pt2 does not exist"), std::string::npos) << m.status();
  m = Load("auto");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->format(), "torchscript");
}

// LibTorch extracts every method of a package into its own /tmp folder and removes it only when the
// model is unloaded, so a server killed with -9 left 10-20 MB per method behind; a CPU method's folder
// goes as soon as it is loaded, and the model still answers from the mapped library.
TEST_F(ModelLoadTest, APackagesExtractedFilesAreRemovedOnceLoaded) {
  fs::copy_file(demo_ / "sentiment" / "1" / "model.cpu.pt2", dir_ / "model.cpu.pt2");
  absl::StatusOr<std::unique_ptr<Model>> m = Load("pt2");
  ASSERT_TRUE(m.ok()) << m.status();
  std::ifstream maps("/proc/self/maps");
  int mapped = 0;
  for (std::string line; std::getline(maps, line);) {
    const size_t inside = line.find("/model/data/aotinductor/");
    if (inside == std::string::npos) continue;
    ++mapped;
    EXPECT_TRUE(absl::EndsWith(line, " (deleted)")) << line;
    const fs::path folder = line.substr(line.find('/'), inside - line.find('/'));
    EXPECT_FALSE(fs::exists(folder)) << folder;
  }
  EXPECT_GE(mapped, 2) << "both methods' libraries are mapped";
  auto [ids, mask] = Batch({{5, 6, 7}, {8}});
  absl::StatusOr<ModelOutputs> out = (*m)->Forward(ids, mask, testing::Named({"logits", "attention"}));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->at(Output::kLogits).size(0), 2);
}

// The CPU packages of a folder are tried in kCpuPackages' order (bf16, x86-64-v4, model.cpu.pt2): the
// first that loads serves, and why each one before it did not is the format note. Any valid package
// stands in for a variant here (the demo's, compiled for x86-64-v3, runs on every CPU these tests
// run on); model_store/tests/test_pt2.py builds real ones.
TEST_F(ModelLoadTest, TheFirstCpuPackageThatRunsHereServesAndAPinLoadsOnlyThatOne) {
  const fs::path demo = demo_ / "sentiment" / "1";
  fs::copy_file(demo / "model.pt", dir_ / "model.pt");
  fs::copy_file(demo / "model.cpu.pt2", dir_ / "model.cpu.pt2");
  fs::copy_file(demo / "model.cpu.pt2", dir_ / "model.cpu.x86-64-v4.pt2");
  std::ofstream(dir_ / "model.cpu.x86-64-v4-bf16.pt2") << "not a zip archive";
  std::ofstream(dir_ / "model.cpu.x86-64-v4-int8.pt2") << "not a zip archive";
  absl::StatusOr<std::unique_ptr<Model>> m = Load("auto");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(fs::path((*m)->file()).filename(), "model.cpu.x86-64-v4.pt2");
  EXPECT_EQ((*m)->precision(), "float32");
  // Tried in kCpuPackages' order: int8, then bf16, before the package that loads.
  const std::string& why = (*m)->fallback_reason();
  EXPECT_NE(why.find("model.cpu.x86-64-v4-bf16.pt2 not used: cannot read"), std::string::npos) << why;
  EXPECT_LT(why.find("model.cpu.x86-64-v4-int8.pt2 not used: cannot read"),
            why.find("model.cpu.x86-64-v4-bf16.pt2 not used"))
      << why;

  m = Load("auto", 1, "base");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(fs::path((*m)->file()).filename(), "model.cpu.pt2");
  EXPECT_EQ((*m)->fallback_reason(), "");

  // A pinned package that cannot load: "auto" serves model.pt and says why; "pt2" fails.
  m = Load("auto", 1, "x86-64-v4-bf16");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->format(), "torchscript");
  EXPECT_NE((*m)->fallback_reason().find("model.cpu.x86-64-v4-bf16.pt2 not used"), std::string::npos);
  m = Load("pt2", 1, "x86-64-v4-bf16");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("as a PT2 package"), std::string::npos) << m.status();

  // Every package broken: "auto" lists each one's reason; a pin the folder lacks is named.
  std::ofstream(dir_ / "model.cpu.x86-64-v4.pt2", std::ios::trunc) << "broken";
  std::ofstream(dir_ / "model.cpu.pt2", std::ios::trunc) << "broken";
  m = Load("auto");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->format(), "torchscript");
  for (const char* file :
       {"model.cpu.x86-64-v4-int8.pt2", "model.cpu.x86-64-v4-bf16.pt2", "model.cpu.x86-64-v4.pt2", "model.cpu.pt2"}) {
    EXPECT_NE((*m)->fallback_reason().find(absl::StrCat(file, " not used")), std::string::npos) << file;
  }
  fs::remove(dir_ / "model.cpu.x86-64-v4.pt2");
  m = Load("pt2", 1, "x86-64-v4");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("cpu_package pins model.cpu.x86-64-v4.pt2"), std::string::npos) << m.status();
  m = Load("auto", 1, "x86-64-v4");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->format(), "torchscript");
  EXPECT_NE((*m)->fallback_reason().find("does not hold"), std::string::npos) << (*m)->fallback_reason();
  m = Load("auto", 1, "avx9");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(
      m.status().message().find("cpu package 'avx9' is not auto, x86-64-v4-int8, x86-64-v4-bf16, x86-64-v4, base"),
      std::string::npos)
      << m.status();
}

TEST_F(ModelLoadTest, ACorruptPackageFallsBackToTorchScriptWithTheReasonOrFailsWhenForced) {
  fs::copy_file(demo_ / "sentiment" / "1" / "model.pt", dir_ / "model.pt");
  std::ofstream(dir_ / "model.cpu.pt2") << "not a zip archive";
  absl::StatusOr<std::unique_ptr<Model>> m = Load("auto");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->format(), "torchscript");
  EXPECT_NE((*m)->fallback_reason().find("model.cpu.pt2 not used: cannot read"), std::string::npos)
      << (*m)->fallback_reason();
  m = Load("pt2");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("as a PT2 package"), std::string::npos) << m.status();
  fs::remove(dir_ / "model.pt");
  m = Load("auto");
  EXPECT_FALSE(m.ok());
  fs::remove(dir_ / "model.cpu.pt2");
  m = Load("auto");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
}

// --- backend parity on the demo models -----------------------------------------------------

// The float32 package (model.cpu.pt2, pinned: a store built with `--cpu-variants` would otherwise
// serve its bf16 one) answers as TorchScript within 1e-5, tags equal.
void ExpectParity(const fs::path& version, const std::vector<std::string>& outputs) {
  LoadOptions o;
  o.device = "cpu";
  o.format = ModelFormat::kTorchScript;
  absl::StatusOr<std::unique_ptr<Model>> script = Model::Load(version.string(), o);
  ASSERT_TRUE(script.ok()) << script.status();
  o.format = ModelFormat::kPt2;
  o.instances = 2;
  o.cpu_package = "base";
  absl::StatusOr<std::unique_ptr<Model>> compiled = Model::Load(version.string(), o);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ASSERT_EQ((*compiled)->precision(), "float32") << (*compiled)->file();
  torch::manual_seed(3);
  const int64_t vocab = static_cast<int64_t>((*script)->vocabulary().size());
  const int64_t max_tokens = (*script)->manifest().tokenizer.max_tokens;
  // A one-token batch (below the package's smallest length: padded and cut back), odd sizes, the
  // longest texts, and padding in every batch but the first.
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 17}, {8, max_tokens}, {5, 40}}) {
    at::Tensor lengths = torch::randint(1, t + 1, {b}, torch::kLong);
    lengths[0] = t;
    at::Tensor mask = torch::arange(t).unsqueeze(0) < lengths.unsqueeze(1);
    at::Tensor ids = torch::randint(2, vocab, {b, t}, torch::kLong) * mask;
    for (bool maps : {true, false}) {
      OutputSet wanted = testing::Named(outputs);
      if (maps) wanted.set(static_cast<size_t>(Output::kLayerAttention));
      auto a = (*script)->Forward(ids, mask, wanted);
      auto c = (*compiled)->Forward(ids, mask, wanted);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_EQ(a->present(), c->present());
      for (Output output : InOrder(a->present())) {
        const char* name = OutputName(output);
        const at::Tensor& want = a->at(output);
        const at::Tensor& got = c->at(output);
        ASSERT_EQ(got.sizes(), want.sizes()) << name << " at batch " << b << "x" << t;
        if (want.is_floating_point()) {
          EXPECT_LE((got - want).abs().max().item<float>(), 1e-5) << name << " at batch " << b << "x" << t;
        } else {
          EXPECT_TRUE(torch::equal(got, want)) << name << " at batch " << b << "x" << t;
        }
      }
    }
  }
}

TEST_F(ModelLoadTest, TheClassifierAnswersTheSameFromBothFormats) {
  ExpectParity(demo_ / "sentiment" / "1", {"logits", "attention", "gates", "layer_gates"});
}

TEST_F(ModelLoadTest, TheTaggerAnswersTheSameFromBothFormatsTagsIncluded) {
  ASSERT_TRUE(fs::exists(demo_ / "ner" / "1" / "model.cpu.pt2"))
      << "run scripts/setup.sh first (it compiles the demo packages)";
  ExpectParity(demo_ / "ner" / "1", {"tags", "emissions", "attention", "gates", "layer_gates"});
  // Both backends read the same CRF (options.occlusion's marginals use it); a classifier has none.
  LoadOptions o;
  o.device = "cpu";
  o.format = ModelFormat::kTorchScript;
  absl::StatusOr<std::unique_ptr<Model>> script = Model::Load((demo_ / "ner" / "1").string(), o);
  o.format = ModelFormat::kPt2;
  o.cpu_package = "base";
  absl::StatusOr<std::unique_ptr<Model>> compiled = Model::Load((demo_ / "ner" / "1").string(), o);
  ASSERT_TRUE(script.ok() && compiled.ok());
  const CrfScores *a = (*script)->crf(), *c = (*compiled)->crf();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(a->num_tags(), static_cast<int>((*script)->manifest().tags.size()));
  EXPECT_EQ(a->start, c->start);
  EXPECT_EQ(a->end, c->end);
  EXPECT_EQ(a->transitions, c->transitions);
  o.format = ModelFormat::kTorchScript;
  absl::StatusOr<std::unique_ptr<Model>> classifier = Model::Load((demo_ / "sentiment" / "1").string(), o);
  ASSERT_TRUE(classifier.ok());
  EXPECT_EQ((*classifier)->crf(), nullptr);
}

}  // namespace
}  // namespace qvi

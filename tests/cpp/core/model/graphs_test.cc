// CUDA graphs without a GPU: the shape buckets, and everything Model does around a graph (capture at
// every bucket per instance, padding a batch up to its bucket and cutting the answer back, one
// replay at a time per instance, the report, the reasons for running without) on a backend that
// emulates graphs on the CPU (test_util/emulated_graphs.h), with the fake and with the demo models.
// The CUDA plugin itself is only loaded here; it captures on a GPU machine (docs/performance.md).
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "server/core/manifest/serving_config.h"
#include "server/core/manifest/shape_buckets.h"
#include "server/core/model/graphs.h"
#include "server/core/model/model.h"
#include "tests/cpp/test_util/emulated_graphs.h"
#include "tests/cpp/test_util/fake_model.h"
#include "tests/cpp/test_util/run.h"

namespace qvi {
namespace {

namespace fs = std::filesystem;

TEST(ShapeBucketsTest, PowersOfTwoEndAtTheMaximum) {
  EXPECT_EQ(PowersOfTwoUpTo(1, 32), (std::vector<int64_t>{1, 2, 4, 8, 16, 32}));
  EXPECT_EQ(PowersOfTwoUpTo(8, 100), (std::vector<int64_t>{8, 16, 32, 64, 100}));
  EXPECT_EQ(PowersOfTwoUpTo(8, 5), (std::vector<int64_t>{5}));
  EXPECT_EQ(PowersOfTwoUpTo(1, 1), (std::vector<int64_t>{1}));
  EXPECT_TRUE(PowersOfTwoUpTo(1, 0).empty());
}

TEST(ShapeBucketsTest, FitPicksTheSmallestBucketThatHoldsTheBatch) {
  ShapeBuckets buckets({1, 4, 16}, {8, 32, 128});
  EXPECT_EQ(buckets.size(), 9u);
  EXPECT_EQ(buckets.Fit(1, 1), (ShapeBucket{1, 8}));
  EXPECT_EQ(buckets.Fit(2, 8), (ShapeBucket{4, 8}));
  EXPECT_EQ(buckets.Fit(4, 9), (ShapeBucket{4, 32}));
  EXPECT_EQ(buckets.Fit(16, 128), (ShapeBucket{16, 128}));
  EXPECT_FALSE(buckets.Fit(17, 8).has_value());
  EXPECT_FALSE(buckets.Fit(1, 129).has_value());
  EXPECT_EQ(buckets.All().front(), (ShapeBucket{1, 8}));
  EXPECT_EQ(buckets.All().back(), (ShapeBucket{16, 128}));
}

TEST(ShapeBucketsTest, CheckNamesTheFieldAndTheLimit) {
  const std::string where = "serving.json: 'cuda_graphs'";
  EXPECT_TRUE(ShapeBuckets::Check({1, 2}, {8}, 32, 128, where).ok());
  absl::Status s = ShapeBuckets::Check({1, 64}, {8}, 32, 128, where);
  EXPECT_NE(s.message().find("'batch_sizes' has 64; each must be in 1..32 (max_batch_size)"), std::string::npos) << s;
  s = ShapeBuckets::Check({1}, {8, 256}, 32, 128, where);
  EXPECT_NE(s.message().find("'lengths' has 256; each must be in 1..128 (the model's max_tokens)"), std::string::npos)
      << s;
  s = ShapeBuckets::Check({2, 2}, {8}, 32, 128, where);
  EXPECT_NE(s.message().find("strictly ascending"), std::string::npos) << s;
  std::vector<int64_t> many(17), lengths(16);
  for (int i = 0; i < 17; ++i) many[i] = i + 1;
  for (int i = 0; i < 16; ++i) lengths[i] = i + 1;
  s = ShapeBuckets::Check(many, lengths, 32, 128, where);
  EXPECT_NE(s.message().find("272 graphs per instance; at most 256"), std::string::npos) << s;
}

TEST(ShapeBucketsTest, ServingJsonTurnsGraphsOffOrSetsTheBuckets) {
  auto o = ServingOverrides::Parse(R"({"cuda_graphs": false})");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->cuda_graphs->enabled);
  o = ServingOverrides::Parse(R"({"cuda_graphs": {"batch_sizes": [1, 8, 32], "lengths": [16, 64]}})");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->cuda_graphs->enabled);
  EXPECT_EQ(o->cuda_graphs->batch_sizes, (std::vector<int64_t>{1, 8, 32}));
  EXPECT_EQ(o->cuda_graphs->lengths, (std::vector<int64_t>{16, 64}));
  for (auto [json, error] : std::vector<std::pair<std::string, std::string>>{
           {R"({"cuda_graphs": "yes"})", "'cuda_graphs' must be true, false or"},
           {R"({"cuda_graphs": {"batch_sizes": [8, 4]}})", "'cuda_graphs.batch_sizes' must be strictly ascending"},
           {R"({"cuda_graphs": {"lengths": [0]}})", "'cuda_graphs.lengths' must be an integer in [1, 65536]"},
           {R"({"cuda_graphs": {"lengths": []}})", "'cuda_graphs.lengths' must be a list of 1 to 256 integers"},
           {R"({"cuda_graphs": {"bucket": [1]}})", "'cuda_graphs.bucket' is not a cuda_graphs setting"},
       }) {
    o = ServingOverrides::Parse(json);
    ASSERT_FALSE(o.ok()) << json;
    EXPECT_NE(o.status().message().find(error), std::string::npos) << o.status();
  }
}

std::pair<at::Tensor, at::Tensor> RandomBatch(int64_t batch, int64_t tokens, int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  at::Tensor lengths = torch::randint(1, tokens + 1, {batch}, torch::kLong);
  lengths[0] = tokens;
  at::Tensor mask = torch::arange(tokens).unsqueeze(0) < lengths.unsqueeze(1);
  at::Tensor ids = torch::randint(2, vocab, {batch, tokens}, torch::kLong) * mask;
  return {ids, mask};
}

// `tolerance`: the largest difference allowed, relative to the largest magnitude of the expected
// output (at least 1). On the CPU a graph replays the same kernels (1e-5). On a GPU a padded bucket
// runs other kernels than the unpadded shape (cuBLAS and cuDNN pick by shape, and cuDNN's convolutions
// use TF32 by default), so sums are ordered differently: measured on an H200, up to 1.6e-4 on the
// tagger's emissions. Labels and tags must still be equal.
void ExpectSameAnswers(const ModelOutputs& got, const ModelOutputs& want, const std::string& where,
                       double tolerance = 1e-5) {
  ASSERT_EQ(got.present(), want.present()) << where;
  for (Output output : InOrder(want.present())) {
    const char* name = OutputName(output);
    const at::Tensor& w = want.at(output);
    const at::Tensor& g = got.at(output);
    ASSERT_EQ(g.sizes(), w.sizes()) << name << " " << where;
    if (w.is_floating_point()) {
      const double scale = std::max(1.0, w.abs().max().item<double>());
      EXPECT_LE((g - w).abs().max().item<double>(), tolerance * scale) << name << " " << where;
    } else {
      EXPECT_TRUE(torch::equal(g, w)) << name << " " << where;
    }
  }
}

// A version's serving settings as far as its graphs read them: instances and bucket lists (the
// default max_batch_size, graphs on).
ServingConfig GraphOptions(int instances, std::vector<int64_t> batch_sizes = {}, std::vector<int64_t> lengths = {}) {
  ServingConfig o;
  o.device = "cpu";
  o.instances = instances;
  o.cuda_graphs.batch_sizes = std::move(batch_sizes);
  o.cuda_graphs.lengths = std::move(lengths);
  return o;
}

TEST(ModelGraphsTest, CapturesEveryBucketPerInstanceAndReports) {
  EmulatedGraphBackend backend;
  std::unique_ptr<FakeModel> model = FakeModel::Create("fake", /*max_tokens=*/16);
  ASSERT_TRUE(model->PrepareGraphs(GraphOptions(/*instances=*/2, {}, {}), &backend).ok());
  const GraphReport& r = model->graphs();
  EXPECT_TRUE(r.active) << r.note;
  // Defaults: batch sizes 1..max_batch_size (the manifest's, 32) and lengths 8..max_tokens (16).
  EXPECT_EQ(r.batch_sizes, (std::vector<int64_t>{1, 2, 4, 8, 16, 32}));
  EXPECT_EQ(r.lengths, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(r.graphs, 24);
  EXPECT_EQ(backend.captures(), 24);
  EXPECT_GT(r.memory_bytes, 0);
  EXPECT_EQ(r.note, "24 graphs (2 instance(s) × 12 shapes) of the forward without maps");
  // Each instance's graphs are captured through that instance (an AOTInductor package on a GPU
  // has a loader per instance, which its graphs must replay).
  ASSERT_EQ(model->instance_runs().size(), 2u);
  EXPECT_EQ(model->instance_runs().at(0), model->instance_runs().at(1));
  EXPECT_GE(model->instance_runs().at(0), 12);
  // The version's max_batch_size bounds the default batch sizes.
  ServingConfig o = GraphOptions(1);
  o.max_batch_size = 5;
  ASSERT_TRUE(model->PrepareGraphs(o, &backend).ok());
  EXPECT_EQ(model->graphs().batch_sizes, (std::vector<int64_t>{1, 2, 4, 5}));
}

TEST(ModelGraphsTest, AnswersAreThoseOfTheForwardWithoutAGraphAtEveryShape) {
  EmulatedGraphBackend backend;
  std::unique_ptr<FakeModel> eager = FakeModel::Create("fake", 16);
  std::unique_ptr<FakeModel> graphed = FakeModel::Create("fake", 16);
  ASSERT_TRUE(graphed->PrepareGraphs(GraphOptions(1, {1, 4, 8}, {4, 16}), &backend).ok());
  const OutputSet wanted = testing::Named({"logits", "attention", "gates", "layer_gates"});
  int replays = 0;
  // Exactly a bucket, padded in length, padded in batch, both, and one text too many for any bucket.
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{4, 16}, {1, 3}, {3, 4}, {5, 11}, {9, 5}}) {
    auto [ids, mask] = RandomBatch(b, t, 5, static_cast<uint64_t>(b * 100 + t));
    auto want = eager->Forward(ids, mask, wanted);
    auto got = graphed->Forward(ids, mask, wanted);
    ASSERT_TRUE(want.ok() && got.ok()) << got.status();
    ExpectSameAnswers(*got, *want, absl::StrCat(b, "x", t));
    if (b <= 8) ++replays;
    EXPECT_EQ(backend.replays(), replays) << b << "x" << t;
  }
  // The maps are never captured: a batch that asks for them runs the forward with maps.
  auto [ids, mask] = RandomBatch(2, 4, 5, 7);
  const int with_maps = graphed->runs_with_maps();
  auto maps = graphed->Forward(ids, mask, testing::Named({"logits", "layer_attention"}));
  ASSERT_TRUE(maps.ok()) << maps.status();
  EXPECT_EQ(graphed->runs_with_maps(), with_maps + 1);
  EXPECT_EQ(backend.replays(), replays);
}

TEST(ModelGraphsTest, AnAnswerIsNotOverwrittenByTheNextReplay) {
  EmulatedGraphBackend backend;
  std::unique_ptr<FakeModel> model = FakeModel::Create("fake", 16);
  ASSERT_TRUE(model->PrepareGraphs(GraphOptions(1, {2}, {4}), &backend).ok());
  auto [a_ids, a_mask] = RandomBatch(2, 4, 5, 1);
  auto [b_ids, b_mask] = RandomBatch(2, 4, 5, 2);
  auto first = model->Forward(a_ids, a_mask, testing::Named({"logits", "gates"}));
  ASSERT_TRUE(first.ok());
  const at::Tensor kept = first->at(Output::kGates).clone();
  auto second = model->Forward(b_ids, b_mask, testing::Named({"logits", "gates"}));
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(torch::equal(first->at(Output::kGates), second->at(Output::kGates)));
  EXPECT_TRUE(torch::equal(first->at(Output::kGates), kept));
}

// On the CPU a launch has replayed and copied its answer out when it returns, so the slot is free for
// the next launch at once (on a GPU the thread's stream keeps it: the demo parity test below).
TEST(ModelGraphsTest, LaunchedBatchesKeepTheirOwnAnswersCollectedInAnyOrder) {
  EmulatedGraphBackend backend;
  std::unique_ptr<FakeModel> model = FakeModel::Create("fake", 16);
  ASSERT_TRUE(model->PrepareGraphs(GraphOptions(1, {4}, {8}), &backend).ok());
  // Three batches launched on the one instance's graphs before any is collected, collected last first.
  std::vector<LaunchedForward> launched;
  std::vector<at::Tensor> want;
  for (int i = 0; i < 3; ++i) {
    auto [ids, mask] = RandomBatch(3, 6, 5, static_cast<uint64_t>(40 + i));
    want.push_back((ids.to(torch::kFloat) * mask.to(torch::kFloat)).sum(1));
    auto l = model->Launch(ids, mask, testing::Named({"logits"}));
    ASSERT_TRUE(l.ok()) << l.status();
    launched.push_back(*std::move(l));
  }
  EXPECT_EQ(backend.replays(), 3);
  for (int i = 2; i >= 0; --i) {
    auto out = model->Collect(std::move(launched[static_cast<size_t>(i)]));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(torch::equal(out->at(Output::kLogits).select(1, 0), want[static_cast<size_t>(i)])) << i;
  }
}

TEST(ModelGraphsTest, ConcurrentCallersGetTheirOwnAnswers) {
  EmulatedGraphBackend backend;
  std::unique_ptr<FakeModel> model = FakeModel::Create("fake", 16);
  ASSERT_TRUE(model->PrepareGraphs(GraphOptions(2, {1, 4}, {8}), &backend).ok());
  // Four callers on two instances' graphs: two replay, the others find no free slot and run without.
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int i = 0; i < 50; ++i) {
        auto [ids, mask] = RandomBatch(3, 6, 5, static_cast<uint64_t>(c * 1000 + i));
        auto out = model->Forward(ids, mask, testing::Named({"logits"}));
        const at::Tensor want = (ids.to(torch::kFloat) * mask.to(torch::kFloat)).sum(1);
        if (!out.ok() || !torch::equal(out->at(Output::kLogits).select(1, 0), want)) ++wrong;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(backend.replays(), 0);
}

TEST(ModelGraphsTest, ReasonsForRunningWithoutGraphs) {
  std::unique_ptr<FakeModel> model = FakeModel::Create("fake", 16);
  ASSERT_TRUE(model->PrepareGraphs(GraphOptions(1), nullptr).ok());
  EXPECT_FALSE(model->graphs().active);
  EXPECT_EQ(model->graphs().note, "none on the CPU");
  EmulatedGraphBackend backend;
  ServingConfig off = GraphOptions(1);
  off.cuda_graphs.enabled = false;
  ASSERT_TRUE(model->PrepareGraphs(off, &backend).ok());
  EXPECT_EQ(model->graphs().note, "off (--cuda-graphs=false or serving.json \"cuda_graphs\")");
  // A forward that cannot be captured at some shape: served without graphs, the reason reported.
  backend.fail_at = ShapeBucket{4, 16};
  ASSERT_TRUE(model->PrepareGraphs(GraphOptions(1, {1, 4}, {8, 16}), &backend).ok());
  EXPECT_FALSE(model->graphs().active);
  EXPECT_NE(model->graphs().note.find("capture failed at 4 texts × 16 tokens, so it runs without graphs: operation "
                                      "not permitted when stream is capturing"),
            std::string::npos)
      << model->graphs().note;
  auto [ids, mask] = RandomBatch(2, 5, 5, 3);
  const int replays = backend.replays();
  ASSERT_TRUE(model->Forward(ids, mask, testing::Named({"logits"})).ok());
  EXPECT_EQ(backend.replays(), replays);
  // Buckets the model cannot run are an error that fails the load, naming the file and the limit.
  absl::Status s = model->PrepareGraphs(GraphOptions(1, {1}, {8, 32}), &backend);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("serving.json: 'cuda_graphs' 'lengths' has 32; each must be in 1..16"), std::string::npos)
      << s;
}

// The demo models through emulated graphs: a padded bucket answers what the batch's own shape does,
// for the classifier (TorchScript) and the tagger in both formats (the package's tags are decoded on
// the host after the replay).
void ExpectGraphParity(const fs::path& version, const std::string& format,
                       std::initializer_list<std::string_view> names, GraphBackend* real_backend = nullptr,
                       const std::string& device = "cpu") {
  const OutputSet wanted = testing::Named(names);
  EmulatedGraphBackend emulated;
  GraphBackend* backend = real_backend != nullptr ? real_backend : &emulated;
  LoadOptions plain;
  plain.device = device;
  plain.format = *ParseModelFormat(format);
  auto eager = Model::Load(version.string(), plain);
  ASSERT_TRUE(eager.ok()) << eager.status();
  const int64_t max_tokens = (*eager)->manifest().tokenizer.max_tokens;
  auto graphed = Model::Load(version.string(), plain);
  ASSERT_TRUE(graphed.ok()) << graphed.status();
  ASSERT_TRUE((*graphed)->PrepareGraphs(GraphOptions(1, {1, 4, 8}, {8, 32, max_tokens}), backend).ok());
  ASSERT_TRUE((*graphed)->graphs().active) << (*graphed)->graphs().note;
  const int64_t vocab = static_cast<int64_t>((*eager)->vocabulary().size());
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 17}, {8, max_tokens}, {5, 40}, {2, 8}}) {
    auto [ids, mask] = RandomBatch(b, t, vocab, static_cast<uint64_t>(b * 1000 + t));
    auto want = (*eager)->Forward(ids, mask, wanted);
    auto got = (*graphed)->Forward(ids, mask, wanted);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameAnswers(*got, *want, absl::StrCat(format, " ", b, "x", t), device == "cpu" ? 1e-5 : 1e-3);
    if (want->has(Output::kLogits)) {
      EXPECT_TRUE(torch::equal(got->at(Output::kLogits).argmax(-1), want->at(Output::kLogits).argmax(-1)))
          << "labels " << format << " " << b << "x" << t;
    }
  }
  if (real_backend == nullptr) EXPECT_EQ(emulated.replays(), 5);
  // Launched one after another on one thread before any is collected (the runner's pipeline): each
  // batch still gets its own answers; on a GPU they replay on the slot that thread's stream holds,
  // one after another, each after the copies of the one before.
  DeviceStreamScope stream{c10::Device(device)};
  std::vector<LaunchedForward> launched;
  std::vector<ModelOutputs> wants;
  const std::vector<std::pair<int64_t, int64_t>> shapes{{4, 8}, {4, 8}, {1, 30}, {8, 9}, {4, 8}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto [ids, mask] = RandomBatch(shapes[i].first, shapes[i].second, vocab, 7000 + i);
    auto want = (*eager)->Forward(ids, mask, wanted);
    ASSERT_TRUE(want.ok()) << want.status();
    wants.push_back(*std::move(want));
    auto l = (*graphed)->Launch(ids, mask, wanted);
    ASSERT_TRUE(l.ok()) << l.status();
    launched.push_back(*std::move(l));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto got = (*graphed)->Collect(std::move(launched[i]));
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameAnswers(*got, wants[i], absl::StrCat(format, " launched ", i), device == "cpu" ? 1e-5 : 1e-3);
  }
  if (real_backend == nullptr) EXPECT_EQ(emulated.replays(), 10);
}

class DemoGraphsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // QVI_SOURCE_DIR in the environment: a copy of the checkout elsewhere (a GPU machine's).
    const char* root = std::getenv("QVI_SOURCE_DIR");
    demo_ = fs::path(root != nullptr ? root : QVI_SOURCE_DIR) / "model_store" / "store";
    // TorchScript only: a GPU bundle carries no CPU packages; the test that needs one checks for it.
    ASSERT_TRUE(fs::exists(demo_ / "ner" / "1" / "model.pt")) << "run scripts/setup.sh first";
  }
  fs::path demo_;
};

TEST_F(DemoGraphsTest, TheClassifierAnswersTheSameThroughAPaddedGraph) {
  ExpectGraphParity(demo_ / "sentiment" / "1", "torchscript", {"logits", "attention", "gates", "layer_gates"});
}

TEST_F(DemoGraphsTest, TheTaggerAnswersTheSameThroughAPaddedGraphInBothFormats) {
  ExpectGraphParity(demo_ / "ner" / "1", "torchscript", {"tags", "emissions", "attention", "gates", "layer_gates"});
  ASSERT_TRUE(fs::exists(demo_ / "ner" / "1" / "model.cpu.pt2"))
      << "run scripts/setup.sh first (it compiles the package)";
  ExpectGraphParity(demo_ / "ner" / "1", "pt2", {"tags", "emissions", "attention", "gates", "layer_gates"});
}

#ifdef QVI_GRAPH_PLUGIN
// The plugin links and loads on a machine without a GPU (libtorch_cuda loaded first, as the server
// does), and its backend claims CUDA devices only.
TEST(CudaGraphPluginTest, LoadsAndSupportsCudaDevicesOnly) {
  LoadCudaSupport();
  absl::StatusOr<GraphBackend*> backend = LoadGraphPlugin(QVI_GRAPH_PLUGIN);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_TRUE((*backend)->Supports(c10::Device(torch::kCUDA, 0)));
  EXPECT_FALSE((*backend)->Supports(c10::Device(torch::kCPU)));
  if (!torch::cuda::is_available()) {
    absl::StatusOr<GraphBackend*> beside = LoadCudaGraphBackend();
    EXPECT_FALSE(beside.ok());
    EXPECT_EQ(beside.status().message(), "libqvi_cuda_graphs.so loaded, but this process has no CUDA device");
  }
}

// The plugin beside this test binary when there is one (a bundle copied to a GPU machine), else the
// build's.
absl::StatusOr<GraphBackend*> GpuPlugin() {
  const fs::path beside = fs::read_symlink("/proc/self/exe").parent_path() / kGraphPluginFile;
  return LoadGraphPlugin(fs::exists(beside) ? beside.string() : QVI_GRAPH_PLUGIN);
}

// On a GPU machine (skipped elsewhere): a forward that fails inside a capture -- here it synchronises
// the device, which a capture forbids, as an AOTInductor runner's event query did -- is reported,
// and leaves this thread able to synchronise, to run and to capture again. (The capture used to be
// ended on the wrong stream, so every later synchronising call of the thread failed.)
TEST(CudaGraphPluginTest, OnAGpuAFailedCaptureLeavesTheThreadServing) {
  LoadCudaSupport();
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "needs a CUDA device (run on a GPU machine: bench/gpu_session.sh graphs)";
  absl::StatusOr<GraphBackend*> backend = GpuPlugin();
  ASSERT_TRUE(backend.ok()) << backend.status();
  const c10::Device cuda(torch::kCUDA, 0);
  const at::Tensor ids = torch::arange(16, torch::TensorOptions().dtype(torch::kLong).device(cuda)).view({2, 8});
  const at::Tensor mask = torch::ones({2, 8}, torch::TensorOptions().dtype(torch::kBool).device(cuda));
  bool synchronise = true;
  const DeviceForward forward = [&synchronise](const at::Tensor& i, const at::Tensor& m) {
    ModelOutputs out;
    out[Output::kLogits] = (i.to(torch::kFloat) * m.to(torch::kFloat)).sum(1, /*keepdim=*/true) * 2;
    if (synchronise) torch::cuda::synchronize();  // fine in the warm-up runs, forbidden in the capture
    return out;
  };
  std::unique_ptr<GraphPool> pool = (*backend)->NewPool(cuda);
  absl::StatusOr<std::unique_ptr<CapturedForward>> failed = (*backend)->Capture(forward, ids, mask, *pool);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("operation not permitted when stream is capturing"), std::string::npos)
      << failed.status();
  EXPECT_NO_THROW(torch::cuda::synchronize());
  EXPECT_NO_THROW(forward(ids, mask));
  synchronise = false;
  absl::StatusOr<std::unique_ptr<CapturedForward>> graph = (*backend)->Capture(forward, ids, mask, *pool);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const at::Tensor other = ids.flip(0).contiguous();
  const ModelOutputs& replayed = (*graph)->Replay(other, mask);
  EXPECT_TRUE(torch::equal(replayed.at(Output::kLogits).cpu(), forward(other, mask).at(Output::kLogits).cpu()));
}

// On a GPU machine (skipped elsewhere): real captures of the demo models answer what their forward
// without graphs does, padded buckets included, and so does the classifier's CUDA package where
// the GPU machine compiled one (bench/gpu_session.sh pt2).
TEST_F(DemoGraphsTest, OnAGpuRealGraphsAnswerTheSame) {
  LoadCudaSupport();
  // CI and the development machine have no GPU; bench/gpu_session.sh graphs runs this on one.
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "needs a CUDA device (run on a GPU machine: bench/gpu_session.sh graphs)";
  absl::StatusOr<GraphBackend*> backend = GpuPlugin();
  ASSERT_TRUE(backend.ok()) << backend.status();
  ExpectGraphParity(demo_ / "sentiment" / "1", "torchscript", {"logits", "attention", "gates", "layer_gates"}, *backend,
                    "cuda");
  ExpectGraphParity(demo_ / "ner" / "1", "torchscript", {"tags", "emissions", "attention", "gates", "layer_gates"},
                    *backend, "cuda");
  if (fs::exists(demo_ / "sentiment" / "1" / "model.cuda.pt2")) {
    ExpectGraphParity(demo_ / "sentiment" / "1", "pt2", {"logits", "attention", "gates", "layer_gates"}, *backend,
                      "cuda");
  }
}
#endif

}  // namespace
}  // namespace qvi

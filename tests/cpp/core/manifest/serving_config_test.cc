// serving.json: what it may set, its errors, and the order in which settings win.
#include "server/core/manifest/serving_config.h"

#include <gtest/gtest.h>

namespace qvi {
namespace {

TEST(ServingConfigTest, OverridesWinOverTheManifestWhichWinsOverDefaults) {
  ServingConfig defaults;
  defaults.instances = 3;
  defaults.max_queued_texts = 100;
  Manifest m;
  m.serving.max_batch_size = 16;
  m.serving.max_batch_tokens = 2048;
  m.serving.max_queue_delay_ms = 1.0;
  absl::StatusOr<ServingOverrides> o = ServingOverrides::Parse(R"({"max_batch_size": 4, "instances": 2,
      "max_queue_delay_ms": 0.5, "device": "cpu", "cpu_package": "base"})");
  ASSERT_TRUE(o.ok()) << o.status();
  ServingConfig c = ResolveServingConfig(defaults, m, *o);
  EXPECT_EQ(c.cpu_package, "base");
  EXPECT_EQ(ResolvePlacement(defaults, *o).cpu_package, "base");
  EXPECT_EQ(ResolvePlacement(defaults, ServingOverrides{}).cpu_package, "auto");
  EXPECT_EQ(c.max_batch_size, 4);       // file
  EXPECT_EQ(c.max_batch_tokens, 2048);  // manifest
  EXPECT_DOUBLE_EQ(c.max_queue_delay_ms, 0.5);
  EXPECT_EQ(c.instances, 2);           // file over the server default
  EXPECT_EQ(c.max_queued_texts, 100);  // server default
  EXPECT_EQ(c.device, "cpu");
  ServingConfig plain = ResolveServingConfig(defaults, m, ServingOverrides{});
  EXPECT_EQ(plain.max_batch_size, 16);
  EXPECT_EQ(plain.instances, 3);
}

// On a GPU the manifest's `serving.cuda` batching (else the GPU defaults) is taken instead of its
// `serving`, the queues left "by device" (0) hold more, and serving.json still wins.
TEST(ServingConfigTest, AVersionOnAGpuTakesTheGpuBatchingAndQueues) {
  ServingConfig by_device;
  by_device.max_queued_texts = 0;
  by_device.max_queued_tokens = 0;
  Manifest m;
  m.serving.max_batch_size = 16;
  ServingConfig cpu = ResolveServingConfig(by_device, m, ServingOverrides{}, /*on_gpu=*/false);
  EXPECT_EQ(cpu.max_batch_size, 16);
  EXPECT_EQ(cpu.max_batch_tokens, defaults::kMaxBatchTokens);
  EXPECT_EQ(cpu.max_queued_texts, defaults::kMaxQueuedTexts);
  EXPECT_EQ(cpu.max_queued_tokens, defaults::kMaxQueuedTokens);
  ServingConfig gpu = ResolveServingConfig(by_device, m, ServingOverrides{}, /*on_gpu=*/true);
  EXPECT_EQ(gpu.max_batch_size, defaults::kGpuMaxBatchSize);
  EXPECT_EQ(gpu.max_batch_tokens, defaults::kGpuMaxBatchTokens);
  EXPECT_EQ(gpu.max_queued_texts, defaults::kGpuMaxQueuedTexts);
  EXPECT_EQ(gpu.max_queued_tokens, defaults::kGpuMaxQueuedTokens);

  m.serving_cuda = BatchingDefaults{64, 8192, 1.0};
  absl::StatusOr<ServingOverrides> o = ServingOverrides::Parse(R"({"max_batch_tokens": 1000})");
  ASSERT_TRUE(o.ok()) << o.status();
  ServingConfig gpu_manifest = ResolveServingConfig(by_device, m, *o, /*on_gpu=*/true);
  EXPECT_EQ(gpu_manifest.max_batch_size, 64);      // the manifest's serving.cuda
  EXPECT_EQ(gpu_manifest.max_batch_tokens, 1000);  // serving.json
  EXPECT_DOUBLE_EQ(gpu_manifest.max_queue_delay_ms, 1.0);

  ServingConfig flag = by_device;
  flag.max_queued_texts = 500;  // --max-queued-texts applies on every device
  EXPECT_EQ(ResolveServingConfig(flag, m, ServingOverrides{}, true).max_queued_texts, 500);
}

TEST(ServingConfigTest, ErrorsNameTheKey) {
  struct Case {
    const char* json;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"max_batch_szie": 8})", "'max_batch_szie' is not a serving setting"},
           {R"({"labels": ["a"]})", "'labels' is not a serving setting"},
           {R"({"max_batch_size": 0})", "'max_batch_size' must be an integer in [1, 65536], got 0"},
           {R"({"instances": 2.5})", "'instances' must be an integer in [1, 64]"},
           {R"({"max_queue_delay_ms": -1})", "'max_queue_delay_ms' must be in [0, 60000]"},
           {R"({"device": 0})", "'device' must be a string"},
           {R"([1])", "not a JSON object"},
           {R"({"version_policy": "newest"})", "'version_policy' version policy 'newest' is not known"},
           {R"({"version_policy": "latest:0"})", "needs a count N in [1, 1000]"},
           {R"({"version_policy": "specific:1,x"})", "has 'x', which is not a version >= 1"},
           {R"({"version_policy": 2})", "'version_policy' must be a string"},
           {R"({"cpu_package": "avx512"})",
            "'cpu_package' must be \"auto\", \"x86-64-v4-int8\", \"x86-64-v4-bf16\", \"x86-64-v4\", \"base\" (\"base\" "
            "is"},
           {R"({"cpu_package": 4})", "'cpu_package' must be"},
           {R"({"abstain_below": 1.5})", "'abstain_below' must be in [0, 1], got 1.5"},
           {R"({"abstain_below": "high"})", "'abstain_below' must be a number"},
       }) {
    absl::StatusOr<ServingOverrides> o = ServingOverrides::Parse(c.json);
    ASSERT_FALSE(o.ok()) << c.json;
    EXPECT_NE(o.status().message().find(c.message), std::string::npos) << o.status().message();
  }
}

// A model's default abstain_below (serving/trust.h) needs calibrated scores: a version without a calibration
// on its card fails its load, the key named.
TEST(ServingConfigTest, ADefaultAbstentionThresholdNeedsACalibratedModel) {
  absl::StatusOr<ServingOverrides> o = ServingOverrides::Parse(R"({"abstain_below": 0.7})");
  ASSERT_TRUE(o.ok()) << o.status();
  Manifest m;
  m.name = "topics";
  const ServingConfig c = ResolveServingConfig(ServingConfig{}, m, *o);
  EXPECT_EQ(c.abstain_below, 0.7);
  EXPECT_FALSE(ResolveServingConfig(ServingConfig{}, m, ServingOverrides{}).abstain_below.has_value());
  const absl::Status raw = CheckServingFor(c, m);
  EXPECT_EQ(raw.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(raw.message(),
            "serving.json: 'abstain_below' judges calibrated probabilities, and model 'topics' has no calibration on "
            "its card (`python -m qvi calibrate --write` adds one)");
  m.calibration = CalibrationCard{};
  EXPECT_TRUE(CheckServingFor(c, m).ok());
  EXPECT_TRUE(CheckServingFor(ServingConfig{}, Manifest{}).ok());
}

TEST(ServingConfigTest, NoFileMeansNoOverrides) {
  absl::StatusOr<ServingOverrides> o = ServingOverrides::Read("/nonexistent-folder-for-qvi-test");
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->max_batch_size.has_value());
  EXPECT_FALSE(o->device.has_value());
}

TEST(ServingConfigTest, VersionPolicies) {
  absl::StatusOr<VersionPolicy> latest = VersionPolicy::Parse("latest:3");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->kind, VersionPolicy::Kind::kLatest);
  EXPECT_EQ(latest->latest, 3);
  absl::StatusOr<VersionPolicy> specific = VersionPolicy::Parse("specific:7,2,7");
  ASSERT_TRUE(specific.ok()) << specific.status();
  EXPECT_EQ(specific->versions, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(specific->ToString(), "specific:2,7");
  EXPECT_EQ(VersionPolicy::Parse("all")->kind, VersionPolicy::Kind::kAll);
  EXPECT_EQ(VersionPolicy().ToString(), "latest:1");  // the default, as in TF Serving and Triton
  for (const char* bad : {"", "latest", "latest:", "latest:-1", "specific:", "specific:0", "every"}) {
    EXPECT_FALSE(VersionPolicy::Parse(bad).ok()) << bad;
  }
  absl::StatusOr<ServingOverrides> o = ServingOverrides::Parse(R"({"version_policy": "all"})");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->version_policy->kind, VersionPolicy::Kind::kAll);
}

}  // namespace
}  // namespace qvi

// How one model is served: its batching, instances and device. Three sources, later ones win:
//   1. the server's defaults (flags),
//   2. the model's manifest (`serving`: max_batch_size, max_batch_tokens, max_queue_delay_ms),
//   3. the operator's file beside the versions, <store>/<model>/serving.json, which may set
//      max_batch_size, max_batch_tokens, max_queue_delay_ms, max_queued_texts, max_queued_tokens,
//      instances, device, format, cpu_package, version_policy, batch_when_idle, cuda_graphs, memory_bytes,
//      abstain_below, shadow.
// The file never changes the model's own facts (labels, tokenizer, outputs). An unknown key or a
// value out of range is an error naming the key, so a typo cannot pass silently.
#ifndef QVI_SERVER_CORE_MANIFEST_SERVING_CONFIG_H_
#define QVI_SERVER_CORE_MANIFEST_SERVING_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "server/core/manifest/manifest.h"
#include "server/core/sched/defaults.h"

namespace qvi {

// Which versions of a model are served (TF Serving's and Triton's version policies):
//   "latest:N"        the N newest versions that load (default latest:1); a version that fails
//                     to load does not count, so the next older one keeps serving;
//   "all"             every version in the store;
//   "specific:1,3"    exactly these versions.
struct VersionPolicy {
  enum class Kind { kLatest, kAll, kSpecific };
  Kind kind = Kind::kLatest;
  int latest = 1;
  std::vector<int64_t> versions;  // kSpecific, ascending

  static absl::StatusOr<VersionPolicy> Parse(const std::string& spec);
  std::string ToString() const;
  bool operator==(const VersionPolicy& o) const {
    return kind == o.kind && latest == o.latest && versions == o.versions;
  }
};

// CUDA graphs for a model on a GPU (docs/performance.md, "The GPU engine"). serving.json's
// "cuda_graphs" is false, true, or {"enabled": bool, "batch_sizes": [...], "lengths": [...]}.
struct GraphSettings {
  bool enabled = defaults::kCudaGraphs;
  std::vector<int64_t> batch_sizes;  // empty: 1, 2, 4, ... up to max_batch_size
  std::vector<int64_t> lengths;      // empty: 8, 16, 32, ... up to the model's max_tokens
  bool operator==(const GraphSettings& o) const {
    return enabled == o.enabled && batch_sizes == o.batch_sizes && lengths == o.lengths;
  }
};

// Which artifact of a version folder to load: kAuto takes the .pt2 compiled for the device kind when
// there is one that runs here, else model.pt; the others load only that format.
enum class ModelFormat { kAuto, kTorchScript, kPt2 };
// "auto", "torchscript" or "pt2".
const char* ModelFormatName(ModelFormat format);
// The format of that name; INVALID_ARGUMENT naming the allowed ones otherwise.
absl::StatusOr<ModelFormat> ParseModelFormat(const std::string& name);

// Which CPU package of a version folder to load (model_store/README.md, "Native CPU packages"):
// "auto" takes the first of kCpuPackages that this CPU runs and the folder holds; a name loads only
// that file ("base" is model.cpu.pt2). The exporter writes an int8 package only where it is the
// fastest of the version's packages on the compiling CPU, so "auto" takes it first.
inline constexpr const char* kCpuPackages[] = {"x86-64-v4-int8", "x86-64-v4-bf16", "x86-64-v4", "base"};
// "auto" or one of kCpuPackages; otherwise INVALID_ARGUMENT naming them.
absl::Status CheckCpuPackage(const std::string& name);
// The file of a CPU package: model.cpu.pt2 for "base", else model.cpu.<name>.pt2.
std::string CpuPackageFile(const std::string& name);

// When a model instance takes a batch. kWhenIdle: an idle instance takes what is queued at once (no
// max_queue_delay_ms wait), so batches form from the texts that arrive while instances are busy.
// kFillOrDelay: it waits up to max_queue_delay_ms for a batch to fill (serving.json's
// "batch_when_idle": false).
enum class BatchingMode { kWhenIdle, kFillOrDelay };

// How one version is served: resolved once per load (ResolveServingConfig) into this one value,
// which the runner, its batch queue (BatchingOptions) and the CUDA graphs read.
struct ServingConfig {
  int max_batch_size = defaults::kMaxBatchSize;
  int max_batch_tokens = defaults::kMaxBatchTokens;
  double max_queue_delay_ms = defaults::kMaxQueueDelayMs;
  // As the server's defaults (ResolveServingConfig's first argument), 0 means by device: the CPU's
  // kMaxQueued* or the GPU's kGpuMaxQueued*. A resolved config always holds the number.
  int max_queued_texts = defaults::kMaxQueuedTexts;
  int64_t max_queued_tokens = defaults::kMaxQueuedTokens;
  // How much later a text counts as having arrived per priority level below high (batch_scheduler.h).
  double priority_aging_ms = defaults::kPriorityAgingMs;
  int instances = 1;
  std::string device = "auto";
  ModelFormat format = ModelFormat::kAuto;
  std::string cpu_package = "auto";
  BatchingMode batching = defaults::kBatchWhenIdle ? BatchingMode::kWhenIdle : BatchingMode::kFillOrDelay;
  GraphSettings cuda_graphs;
  // options.abstain_below for the requests that set none and ask for calibrated scores (serving/trust.h's
  // ApplyServingDefaults); only for a model whose card carries a calibration (CheckServingFor).
  std::optional<double> abstain_below;
};

// A candidate version tried on live traffic (docs/serving.md, "Shadow versions"): serving.json's
// "shadow": {"version": 2, "fraction": 0.25, "keep_texts": false}. A sampled `fraction` of the texts that
// requests without a version send to the model is mirrored to `version` and compared with the answer the
// serving version gives them; `version` never answers a request that names no version. `keep_texts`: the
// texts that disagree most are kept in the comparison's summary as they are (else as a hash).
struct ShadowSettings {
  int64_t version = 0;
  double fraction = 0;
  bool keep_texts = false;
  bool operator==(const ShadowSettings& o) const {
    return version == o.version && fraction == o.fraction && keep_texts == o.keep_texts;
  }
};

// A shadow object ({"version": V, "fraction": F, "keep_texts": B}) as `source` gives it (serving.json's "shadow",
// an admin call's body): INVALID_ARGUMENT naming `source` and the key that is wrong.
absl::StatusOr<ShadowSettings> ParseShadowSettings(const nlohmann::json& j, const std::string& source);

// What a serving.json sets; unset fields keep the value from the sources before it.
struct ServingOverrides {
  std::optional<int> max_batch_size, max_batch_tokens, max_queued_texts, instances;
  std::optional<int64_t> max_queued_tokens;
  std::optional<double> max_queue_delay_ms, priority_aging_ms;
  std::optional<std::string> device;
  std::optional<ModelFormat> format;
  std::optional<std::string> cpu_package;
  std::optional<VersionPolicy> version_policy;
  std::optional<BatchingMode> batching;  // "batch_when_idle": true or false
  std::optional<GraphSettings> cuda_graphs;
  std::optional<double> abstain_below;  // in [0, 1]
  // A version's footprint as the memory budget counts it, instead of the one measured at its load.
  std::optional<int64_t> memory_bytes;
  std::optional<ShadowSettings> shadow;  // per model, as version_policy

  static absl::StatusOr<ServingOverrides> Parse(const std::string& json);
  // Reads <model_dir>/serving.json; no file means no overrides.
  static absl::StatusOr<ServingOverrides> Read(const std::string& model_dir);
};

// Where a version runs and from which artifact: what reading it needs before its manifest is known.
// The manifest cannot set these, so they are the server's defaults with serving.json's applied.
struct Placement {
  std::string device = "auto";  // "auto", "cpu", "cuda" or "cuda:N"
  ModelFormat format = ModelFormat::kAuto;
  int instances = 1;                 // model instances that will run at once (a .pt2 keeps buffers per instance)
  std::string cpu_package = "auto";  // "auto" or one of kCpuPackages
};
Placement ResolvePlacement(const ServingConfig& server_defaults, const ServingOverrides& overrides);

// The effective config, each setting decided here once: the placement, then the server's defaults,
// the manifest's batching and serving.json's settings, later ones winning. `on_gpu`: the version was
// placed on a CUDA device, so the manifest's `serving.cuda` batching (else defaults.h's kGpu*) is
// taken instead of its `serving`, and the queue limits the server leaves at 0 ("by device") are the
// GPU's. The repository calls it once per load, as soon as the artifact's manifest is read, before
// graphs and runner.
ServingConfig ResolveServingConfig(const ServingConfig& server_defaults, const Manifest& manifest,
                                   const ServingOverrides& overrides, bool on_gpu = false);

// What a resolved config asks of its model: FAILED_PRECONDITION naming the key where the model cannot give
// it (abstain_below on a model without calibration). Checked at each load, so the version fails to load.
absl::Status CheckServingFor(const ServingConfig& config, const Manifest& manifest);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MANIFEST_SERVING_CONFIG_H_

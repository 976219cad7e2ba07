// The model interface every backend implements (TorchScript in torchscript_model.h, AOTInductor in
// aoti_model.h), and the device helpers they share.
#ifndef QVI_SERVER_CORE_MODEL_MODEL_H_
#define QVI_SERVER_CORE_MODEL_MODEL_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/base/env.h"
#include "server/core/base/sync.h"
#include "server/core/manifest/manifest.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/manifest/shape_buckets.h"
#include "server/core/model/cuda_support.h"
#include "server/core/model/graphs.h"
#include "server/core/model/model_outputs.h"
#include "server/core/model/viterbi.h"
#include "server/core/text/hf/hf_tokenizer.h"
#include "server/core/text/tokenizer.h"
#include "server/core/text/vocabulary.h"

namespace qvi {

// Which layers and heads of the per-layer outputs (layer_*) leave the device; empty = all. The
// model's outputs keep their order; Forward() adds "layer_index" and "head_index" (int64) naming
// the original layer and head at each position when it selected any.
// With mean_heads, the selected heads are averaged on the device and only the average leaves it:
// the head dimension is 1 and head_index is {-1}.
struct OutputSelection {
  std::vector<int64_t> layers;
  std::vector<int64_t> heads;
  bool mean_heads = false;
};

// A batch's forward pass queued on its device and not yet collected (Model::Launch, Model::Collect).
// Dropped without Collect, it waits for the device before it lets go of what it holds (a graph slot).
class LaunchedForward {
 public:
  LaunchedForward() = default;
  LaunchedForward(LaunchedForward&& other) noexcept;
  // Settles what it held first (waits for its device, lets go of its slot).
  LaunchedForward& operator=(LaunchedForward&& other) noexcept;
  LaunchedForward(const LaunchedForward&) = delete;
  ~LaunchedForward();

 private:
  friend class Model;
  // Waits for the device (and the copies to the host); then lets go of the graph slot. Idempotent.
  void Settle();

  ModelOutputs outputs_;           // on the host, readable once the device is done
  std::function<void()> wait_;     // for the device and the copies; empty: nothing to wait for
  std::function<void()> release_;  // lets go of the graph slot; empty: none held
};

// How to load a version folder: its device, format and instances (serving_config.h). The rest of
// how it is served is resolved once its manifest is read (ResolveServingConfig) and handed to
// PrepareGraphs and the runner.
using LoadOptions = Placement;

inline constexpr char kTorchScriptFile[] = "model.pt";
// model.cpu.pt2 or model.cuda.pt2.
std::string Pt2FileName(const c10::Device& device);
// Every file name a version folder's model may have; a change to any of them reloads it.
std::vector<std::string> ModelFileNames();

// A loaded model version: a compiled model with its manifest, vocabulary and tokenizer. Subclasses
// are the backends (TorchScript, AOTInductor; a fake in the tests); they only run the model, and
// this class does everything around it the same way for all of them.
//
// Torch's exceptions become absl::Status here. A Model is immutable after Load() and Forward() may
// be called from several threads at once. Hold it through a shared_ptr for the life of each request
// so that a version swap never frees it under a running forward pass.
class Model {
 public:
  virtual ~Model() = default;

  // Loads the version folder `dir` in the format `options` picks (see ModelFormat), checks its
  // manifest and vocabulary and warms it up, so that a model that cannot run fails here rather
  // than on a request. When "auto" passed over a package, fallback_reason() says why.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir, const LoadOptions& options);

  // Runs the model on a padded batch (ids and mask [B,T] on the CPU) and returns the outputs in
  // `wanted` that the model produces, copied to the CPU. Other outputs never leave the device.
  // When `wanted` has no layer_attention and the model has a forward without maps, that runs
  // instead: same outputs but the maps, which it never forms (see models.py).
  // Work goes to the calling thread's current stream (see DeviceStreamScope); the result is on the
  // CPU and complete when this returns. Outputs whose shape or type contradicts the manifest are an
  // INTERNAL error: a model file is untrusted input too.
  absl::StatusOr<ModelOutputs> Forward(const at::Tensor& ids, const at::Tensor& mask, const OutputSet& wanted,
                                       const OutputSelection& selection = {}) const;

  // Forward in two halves, so that a caller can prepare and launch the next batch while the device
  // computes this one: Launch packs the batch into pinned memory, queues its copy to the device, the
  // forward (or its graph's replay) and the copies of the outputs back to pinned host memory on the
  // calling thread's stream, and returns without waiting for any of it; Collect waits for it and
  // returns what Forward would. Forward(...) is Collect(Launch(...)). Batches launched on one thread
  // may be collected in any order, on that thread or another; a graph slot stays with the thread and
  // stream that launched on it until its last batch is collected, and batches launched after one
  // another there replay its graphs in stream order (each after the copies of the one before). Where
  // the device is synchronous (the CPU: asynchronous() is false) Launch does all the work.
  absl::StatusOr<LaunchedForward> Launch(const at::Tensor& ids, const at::Tensor& mask, const OutputSet& wanted,
                                         const OutputSelection& selection = {}) const;
  absl::StatusOr<ModelOutputs> Collect(LaunchedForward launched) const;
  // Whether Launch returns before the device is done with the batch: a GPU (unless the backend
  // waits for it on the host, as the AOTInductor tagger decodes there), or the null model's emulated
  // device. Only then does launching the next batch before collecting this one gain anything.
  virtual bool asynchronous() const { return device_.is_cuda(); }

  const Manifest& manifest() const { return *manifest_; }
  // The same manifest, shareable beyond the model's life: an answer carries it without holding the
  // version loaded.
  std::shared_ptr<const Manifest> shared_manifest() const { return manifest_; }
  const Vocabulary& vocabulary() const { return vocabulary_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  // A sub-word model's tokenizer (manifest().subwords()), read from the artifact's tokenizer.json;
  // null for the word and character tokenizers.
  const hf::HfTokenizer* subword_tokenizer() const { return subwords_.get(); }
  std::string device() const { return device_.str(); }
  c10::Device torch_device() const { return device_; }
  // "torchscript" or "pt2" (or what a test's fake says).
  virtual std::string format() const = 0;
  // A package's arithmetic ("float32", "bfloat16"); empty when the backend does not say.
  virtual std::string precision() const { return ""; }
  // How the model was compiled, for the log ("frozen weights"); empty when there is nothing to say.
  virtual std::string compile_note() const { return ""; }
  // The file it was loaded from.
  const std::string& file() const { return file_; }
  // Why the format "auto" would have preferred was not loaded; empty when it was.
  const std::string& fallback_reason() const { return fallback_reason_; }
  // Whether batches that want no attention maps run a forward that never forms them.
  virtual bool has_forward_without_maps() const = 0;
  // A tagger's CRF scores (start, end, transitions), read once at load, for what the server computes
  // over the emissions itself (options.occlusion's marginals); null when the model has no CRF.
  virtual const CrfScores* crf() const { return nullptr; }
  // Its CUDA graphs: whether it has any, the buckets, capture time and memory, or why none.
  const GraphReport& graphs() const { return graph_report_; }

  // Captures the forward that batches without maps run (the forward without maps when the model has
  // one) at every bucket, once per instance, when `serving` turns graphs on and `backend` (null when
  // this process has none: `backend_note` says why) supports this model's device; otherwise notes
  // why not. The buckets: serving.cuda_graphs's lists, else powers of two up to max_batch_size and
  // the model's max_tokens. A forward that cannot be captured leaves the model serving without
  // graphs (the note says why); bucket lists that do not fit the model are an error. The repository
  // calls it after Load() with the version's resolved ServingConfig. Not thread-safe: before serving.
  // Capture time is measured on `env`'s clock.
  absl::Status PrepareGraphs(const ServingConfig& serving, GraphBackend* backend,
                             const std::string& backend_note = "no CUDA graph backend in this process",
                             const Env* env = Env::Default());

 protected:
  Model(Manifest manifest, Vocabulary vocabulary, c10::Device device, std::string file);

  // The backend: runs forward (maps = true) or the forward without maps on ids and mask already
  // on the device, under InferenceMode, and returns every output it has, by name, on the device.
  // May throw; Forward() turns that into a status.
  virtual ModelOutputs Run(const at::Tensor& ids, const at::Tensor& mask, bool maps) const = 0;

  // Run for the capture of instance `instance`'s graphs (0 .. instances-1): a backend whose instances
  // hold state of their own (the AOTInductor package's loader per instance on a GPU) runs that
  // instance's, so that each instance's graphs replay its own; Run by default.
  virtual ModelOutputs RunInstance(int /*instance*/, const at::Tensor& ids, const at::Tensor& mask, bool maps) const {
    return Run(ids, mask, maps);
  }

  // Host work after Run (or a graph's replay) on outputs already cut to the batch's shape, with the
  // batch's own mask (on the CPU): the AOTInductor tagger decodes its tags here. A graph captures Run
  // only, so nothing here may be captured.
  virtual void Finish(ModelOutputs& /*out*/, const at::Tensor& /*mask*/) const {}

  // Reads a sub-word model's tokenizer from the artifact's `tokenizer_json` (its manifest's
  // tokenizer.file): a file missing, malformed or naming a component this server lacks, or ids past
  // the model's vocab_size, fail the load with a message naming it. Nothing for other models. Backends
  // call it in their Load, before WarmUp.
  absl::Status ReadSubwordTokenizer(const std::string& tokenizer_json);

  // Narrows every dimension the catalogue names "T" in `output`'s tensor to `tokens`.
  static at::Tensor NarrowTokens(Output output, at::Tensor t, int64_t tokens);

  // Two warm-up batches through every method, checking that the forward without maps returns what
  // forward does, maps aside: the server picks between them per batch, and an output missing from
  // one would silently vanish from some answers. Backends call it at the end of their Load.
  absl::Status WarmUp();

 private:
  std::shared_ptr<const Manifest> manifest_;
  Vocabulary vocabulary_;
  Tokenizer tokenizer_;
  std::shared_ptr<const hf::HfTokenizer> subwords_;
  c10::Device device_;
  std::string file_;
  std::string fallback_reason_;

  // One model instance's graphs, sharing one memory pool; a graph's buffers are its own, so a slot
  // is used by one thread and stream at a time. Launch() takes the slot its thread already holds on
  // its stream (a GPU's), else a free one, else runs without a graph.
  struct GraphSlot {
    int users = 0;             // batches launched on it and not yet collected (slots_mu_)
    std::thread::id thread;    // whose they are, while users > 0 (slots_mu_)
    c10::StreamId stream = 0;  // the stream they were launched on (slots_mu_)
    std::unique_ptr<GraphPool> pool;
    std::map<ShapeBucket, std::unique_ptr<CapturedForward>> graphs;
  };
  GraphSlot* AcquireGraphSlot() const;
  void ReleaseGraphSlot(GraphSlot* slot) const;
  // Runs the batch (ids and mask on the CPU, `bucket` fits it) through `slot`'s graph: pads to the
  // bucket, replays, and cuts the outputs back to the batch. They alias the graph's buffers.
  ModelOutputs Replay(GraphSlot& slot, const ShapeBucket& bucket, const at::Tensor& ids, const at::Tensor& mask) const;
  // Launch's device work: the batch through a graph slot (held in `slot`, let go by `launched`) or
  // Run, Finish, and only the outputs `wanted` kept, still on the device.
  ModelOutputs RunBatch(const at::Tensor& ids, const at::Tensor& mask, const OutputSet& wanted,
                        LaunchedForward& launched, GraphSlot*& slot) const;
  std::vector<std::unique_ptr<GraphSlot>> graph_slots_;
  mutable Mutex slots_mu_;
  ShapeBuckets buckets_;
  GraphReport graph_report_;
};

// Checks and parses the two files every artifact carries; `where` names the artifact in errors. A
// sub-word model's vocabulary is its tokenizer.json (Model::ReadSubwordTokenizer): `vocab_txt` is not
// read and the Vocabulary returned is empty.
absl::StatusOr<std::pair<Manifest, Vocabulary>> ParseArtifactFiles(const std::string& manifest_json,
                                                                   const std::string& vocab_txt,
                                                                   const std::string& where);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_MODEL_H_

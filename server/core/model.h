// A loaded model version: the TorchScript module with its manifest, vocabulary and tokenizer.
//
// This is the one place that calls into LibTorch: c10::Error and other exceptions thrown by torch
// become absl::Status here. A Model is immutable after Load() and Forward() may be called from
// several threads at once. Hold it through a shared_ptr for the life of each request so that a
// version swap never frees it under a running forward pass.
#ifndef QVI_SERVER_CORE_MODEL_H_
#define QVI_SERVER_CORE_MODEL_H_

#include <torch/script.h>

namespace c10 {
struct StreamGuard;
}

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/manifest.h"
#include "server/core/tokenizer.h"
#include "server/core/vocabulary.h"

namespace qvi {

// Loads LibTorch's CUDA backend, libtorch_cuda.so from the folder of libtorch_cpu.so, when the torch
// in use ships one (the CUDA wheel and the cuda image do; the cpu image does not). Loading it
// registers torch's CUDA hooks and kernels, as linking it would. Call it once at start-up, before
// anything asks torch about CUDA: torch decides on the first question, for the life of the
// process, whether CUDA exists. Returns a line for the start-up log saying what it found.
std::string LoadCudaSupport();

// "auto" (the first GPU when one is present, else the CPU), "cpu", "cuda" or "cuda:N".
absl::StatusOr<torch::Device> ResolveDevice(const std::string& spec);

// Gives the calling thread a stream of its own on `device` while it lives: a CUDA stream from
// torch's pool on a GPU, nothing on the CPU. Each model instance thread holds one, so instances
// overlap their copies and kernels instead of queueing on the default stream. Uses the
// device-generic c10 API, so the same code builds against the CPU and the CUDA torch.
class DeviceStreamScope {
 public:
  explicit DeviceStreamScope(torch::Device device);
  ~DeviceStreamScope();
  DeviceStreamScope(const DeviceStreamScope&) = delete;
  DeviceStreamScope& operator=(const DeviceStreamScope&) = delete;

 private:
  std::unique_ptr<c10::StreamGuard> guard_;
};

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

class Model {
 public:
  // Reads model.pt, checks its manifest and vocabulary, moves it to `device` and runs one warm-up
  // batch, so that a model that cannot run fails here rather than on a request.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path, const std::string& device);

  // Runs the model on a padded batch (ids and mask [B,T] on the CPU) and returns the outputs named
  // in `wanted` that the model produces, copied to the CPU. Other outputs never leave the device.
  // When `wanted` has no layer_attention and the module exports forward_without_maps, that method
  // runs instead of forward: same outputs but the maps, which it never forms (see models.py).
  // Work goes to the calling thread's current stream (see DeviceStreamScope); the result is on the
  // CPU and complete when this returns. Outputs whose shape or type contradicts the manifest are an
  // INTERNAL error: a model file is untrusted input too.
  absl::StatusOr<std::map<std::string, torch::Tensor>> Forward(const torch::Tensor& ids, const torch::Tensor& mask,
                                                               const std::vector<std::string>& wanted,
                                                               const OutputSelection& selection = {}) const;

  const Manifest& manifest() const { return manifest_; }
  const Vocabulary& vocabulary() const { return vocabulary_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  std::string device() const { return device_.str(); }
  // Whether batches that want no attention maps run forward_without_maps.
  bool has_forward_without_maps() const { return without_maps_.has_value(); }
  torch::Device torch_device() const { return device_; }

 private:
  Model(torch::jit::Module module, Manifest manifest, Vocabulary vocabulary, torch::Device device)
      : module_(std::move(module)),
        manifest_(std::move(manifest)),
        vocabulary_(std::move(vocabulary)),
        tokenizer_(manifest_.tokenizer),
        device_(device),
        without_maps_(module_.find_method("forward_without_maps")) {}

  mutable torch::jit::Module module_;  // forward() is not const in the API, but does not mutate
  Manifest manifest_;
  Vocabulary vocabulary_;
  Tokenizer tokenizer_;
  torch::Device device_;
  std::optional<torch::jit::Method> without_maps_;  // declared after module_, which it refers to
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_H_

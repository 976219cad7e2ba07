// CUDA graphs for a model's forward pass, behind an interface the core builds against without CUDA.
//
// A TorchScript or AOTInductor forward of a small model on a GPU is mostly the CPU launching many
// small kernels (2–2.5 ms per forward at any batch size on an H100, issue 14). Captured once per
// shape bucket (shape_buckets.h) into a CUDA graph, a forward is one launch. The CUDA side lives in a
// plugin, libqvi_cuda_graphs.so (server/cuda/), linked against libtorch_cuda; the server loads it
// from beside its executable when torch's CUDA backend is present, as it loads libtorch_cuda itself
// (LoadCudaSupport). The tests put a backend of their own here that emulates graphs on the CPU.
#ifndef QVI_SERVER_CORE_MODEL_GRAPHS_H_
#define QVI_SERVER_CORE_MODEL_GRAPHS_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/model/model_outputs.h"

namespace qvi {

// A model's forward on ids and mask already on its device: what a graph captures.
using DeviceForward = std::function<ModelOutputs(const at::Tensor& ids, const at::Tensor& mask)>;

// One forward captured at one shape, with its static inputs and outputs on the device.
class CapturedForward {
 public:
  virtual ~CapturedForward() = default;
  // Copies ids and mask (the captured shape; on the CPU or the device) into the static inputs and
  // replays the graph on the calling thread's current stream. The outputs are the graph's own
  // buffers: read (copy) them before the next Replay of any graph of the same pool.
  virtual const ModelOutputs& Replay(const at::Tensor& ids, const at::Tensor& mask) = 0;
};

// Memory shared by the graphs one model instance replays, one at a time.
class GraphPool {
 public:
  virtual ~GraphPool() = default;
};

class GraphBackend {
 public:
  virtual ~GraphBackend() = default;
  // Whether this backend can capture forwards of models on `device`.
  virtual bool Supports(const c10::Device& device) const = 0;
  virtual std::unique_ptr<GraphPool> NewPool(const c10::Device& device) = 0;
  // Runs `forward` a few times on a side stream (so that lazy initialisation and TorchScript's
  // profiling runs are over), then captures one run into `pool`, with static inputs shaped like
  // `ids` and `mask`. An operation that cannot be captured (a host synchronisation) is an error.
  virtual absl::StatusOr<std::unique_ptr<CapturedForward>> Capture(const DeviceForward& forward, const at::Tensor& ids,
                                                                   const at::Tensor& mask, GraphPool& pool) = 0;
  // Device memory held for tensors and graphs on `device` (the caching allocator's reserved bytes).
  virtual int64_t ReservedBytes(const c10::Device& device) const = 0;
};

// What a model's graphs are, for GetModel and the log.
struct GraphReport {
  bool active = false;
  // Why there are none (graphs off, a CPU model, no plugin, a forward that cannot be captured), or
  // what was captured.
  std::string note;
  std::vector<int64_t> batch_sizes, lengths;
  int64_t graphs = 0;  // all instances together
  double capture_ms = 0;
  int64_t memory_bytes = 0;  // device memory reserved by the captures
};

// The plugin's one exported symbol: returns its backend (owned by the plugin, never freed).
inline constexpr char kGraphBackendSymbol[] = "qvi_cuda_graph_backend";
inline constexpr char kGraphPluginFile[] = "libqvi_cuda_graphs.so";

// Loads libqvi_cuda_graphs.so from beside this process's executable and returns its backend, or
// why there is none (not built, torch without CUDA, a loader error). Call after LoadCudaSupport().
absl::StatusOr<GraphBackend*> LoadCudaGraphBackend();
// The loading itself, from `path`, with no question about devices (the tests load the plugin on a
// machine without a GPU).
absl::StatusOr<GraphBackend*> LoadGraphPlugin(const std::string& path);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_GRAPHS_H_

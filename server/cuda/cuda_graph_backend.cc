// libqvi_cuda_graphs.so: the CUDA graph backend (server/core/model/graphs.h), on torch's at::cuda::CUDAGraph.
//
// Built only where the CUDA headers are found (CMakeLists.txt) and loaded by the server only when
// torch's CUDA backend is present, so the server itself keeps linking libtorch_cpu alone.
//
// Memory: every graph of one model instance allocates from that instance's pool. Sharing is safe
// because an instance replays one graph at a time and its outputs are copied off before the next
// replay (Model::Forward holds the instance's slot until then): a graph may reuse the blocks
// another graph's capture freed, never the blocks of another graph's live outputs.
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

#include <exception>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/core/model/graphs.h"

namespace qvi {
namespace {

// Warm-up runs before a capture: TorchScript's profiling executor specialises a graph on its first
// two runs, and cuBLAS and cuDNN create their handles and workspaces lazily; none of that may
// happen inside a capture.
constexpr int kWarmUpRuns = 3;

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

class CudaPool final : public GraphPool {
 public:
  explicit CudaPool(c10::DeviceIndex device) : device_(device), id_(at::cuda::graph_pool_handle()) {}
  at::cuda::MempoolId_t id() const { return id_; }
  c10::DeviceIndex device() const { return device_; }

 private:
  c10::DeviceIndex device_;
  at::cuda::MempoolId_t id_;
};

class CudaCapturedForward final : public CapturedForward {
 public:
  const ModelOutputs& Replay(const at::Tensor& ids, const at::Tensor& mask) override {
    // Both copies and the replay go to the calling thread's stream, in that order.
    static_ids_.copy_(ids, /*non_blocking=*/true);
    static_mask_.copy_(mask, /*non_blocking=*/true);
    graph_.replay();
    return outputs_;
  }

 private:
  friend class CudaGraphBackend;
  at::cuda::CUDAGraph graph_;
  at::Tensor static_ids_, static_mask_;
  ModelOutputs outputs_;
};

// After a forward threw inside a capture (or capture_end failed): leaves capture mode on the stream
// and in the allocator, so that the model goes on serving without graphs on this thread. Called
// between capture_begin and the end of capture_end, where the allocator may still send this stream's
// allocations to the pool (capture_end stops that only after ending the capture).
void EndBrokenCapture(const c10::cuda::CUDAStream& stream, const CudaPool& pool) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(stream.stream(), &broken);
    if (broken != nullptr) (void)cudaGraphDestroy(broken);
  }
  // Both of torch's allocators that capture_begin set recording to the pool: the device's and the
  // pinned host memory's (left recording, the next capture into the pool is refused: "already
  // recording to mempool_id"). Each throws if capture_end had already stopped it: nothing left to end.
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(pool.device(), pool.id());
  } catch (const std::exception&) {
  }
  try {
    at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool.id());
  } catch (const std::exception&) {
  }
  (void)cudaGetLastError();  // the capture's error is not sticky; clear it for the next check
}

class CudaGraphBackend final : public GraphBackend {
 public:
  bool Supports(const c10::Device& device) const override { return device.is_cuda(); }

  std::unique_ptr<GraphPool> NewPool(const c10::Device& device) override {
    return std::make_unique<CudaPool>(device.index());
  }

  absl::StatusOr<std::unique_ptr<CapturedForward>> Capture(const DeviceForward& forward, const at::Tensor& ids,
                                                           const at::Tensor& mask, GraphPool& pool_base) override {
    auto& pool = static_cast<CudaPool&>(pool_base);
    auto captured = std::make_unique<CudaCapturedForward>();
    c10::cuda::CUDAGuard device_guard(ids.device());
    // A capture cannot run on the legacy default stream: a side stream, chosen here so that a failed
    // capture is ended on the stream that began it (once the stream guard below is gone, the current
    // stream is another one, and a capture left open on the side stream makes every later
    // synchronising call of this thread fail with "operation not permitted when stream is capturing").
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, ids.device().index());
    bool capturing = false;  // between capture_begin and the end of capture_end
    try {
      captured->static_ids_ = ids.clone();
      captured->static_mask_ = mask.clone();
      c10::cuda::getCurrentCUDAStream(ids.device().index()).synchronize();
      c10::cuda::CUDAStreamGuard stream_guard(side);
      for (int i = 0; i < kWarmUpRuns; ++i) forward(captured->static_ids_, captured->static_mask_);
      side.synchronize();
      // Thread-local mode: other threads (instances serving other models, other loads) may go on
      // allocating and launching while this thread captures.
      captured->graph_.capture_begin(pool.id(), cudaStreamCaptureModeThreadLocal);
      capturing = true;
      captured->outputs_ = forward(captured->static_ids_, captured->static_mask_);
      captured->graph_.capture_end();
      capturing = false;
      captured->graph_.replay();  // one replay, checked, before any request relies on it
      side.synchronize();
    } catch (const std::exception& e) {
      if (capturing) EndBrokenCapture(side, pool);
      return absl::FailedPreconditionError(FirstLine(e));
    }
    return captured;
  }

  int64_t ReservedBytes(const c10::Device& device) const override {
    const c10::CachingDeviceAllocator::DeviceStats stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  }
};

}  // namespace
}  // namespace qvi

extern "C" __attribute__((visibility("default"))) qvi::GraphBackend* qvi_cuda_graph_backend() {
  static auto* backend = new qvi::CudaGraphBackend();  // lives as long as the process
  return backend;
}

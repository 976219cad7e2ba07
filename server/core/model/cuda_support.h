// Where models run: LibTorch's CUDA backend and the CUDA graph plugin loaded at start-up (both with
// dlopen, so that one binary serves on machines with and without a GPU), device names resolved, and
// a stream per model instance thread.
#ifndef QVI_SERVER_CORE_MODEL_CUDA_SUPPORT_H_
#define QVI_SERVER_CORE_MODEL_CUDA_SUPPORT_H_

#include <c10/core/Device.h>
#include <c10/core/StreamGuard.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace c10 {
struct StreamGuard;
}

namespace qvi {

// Loads LibTorch's CUDA backend, libtorch_cuda.so from the folder of libtorch_cpu.so, when the torch
// in use ships one (the CUDA wheel and the cuda image do; the cpu image does not). Loading it
// registers torch's CUDA hooks and kernels, as linking it would. Call it once at start-up, before
// anything asks torch about CUDA: torch decides on the first question, for the life of the
// process, whether CUDA exists. Returns a line for the start-up log saying what it found.
std::string LoadCudaSupport();

// The folder of the libtorch_cpu.so this process runs (the wheel's torch/lib); empty if unknown.
std::string TorchLibraryDir();

// "auto" (the first GPU when one is present, else the CPU), "cpu", "cuda" or "cuda:N".
absl::StatusOr<c10::Device> ResolveDevice(const std::string& spec);

// Gives the calling thread a stream of its own on `device` while it lives: a CUDA stream from
// torch's pool on a GPU, nothing on the CPU. Each model instance thread holds one, so instances
// overlap their copies and kernels instead of queueing on the default stream. Uses the
// device-generic c10 API, so the same code builds against the CPU and the CUDA torch.
class DeviceStreamScope {
 public:
  explicit DeviceStreamScope(c10::Device device);
  ~DeviceStreamScope();
  DeviceStreamScope(const DeviceStreamScope&) = delete;
  DeviceStreamScope& operator=(const DeviceStreamScope&) = delete;

 private:
  std::unique_ptr<c10::StreamGuard> guard_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_CUDA_SUPPORT_H_
